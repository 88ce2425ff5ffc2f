# Call 2 on the same warm machine (carry .gl and .dev/z): join model.bin (call 1 left its
# first half in /root/x), transcribe the 20 shared samples in each of MODES and compare
# them with faster-whisper's greedy transcripts (engine/tests/data), then jfk's
# `verbatim bench --file` with each of VALUES given to the switch VAR (MODES="" or VALUES=""
# skips that part). E2E=1 adds e2e.sh.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
V=/root/w/verbatim; mkdir -p /root/w
[ -x $V ] || { gunzip -c .dev/z/verbatim.gz > $V && chmod +x $V; } || exit 1
mkdir -p /root/m && cp .dev/z/model/* /root/m/ && cat /root/x/model.part1 .dev/z/model.part2 > /root/m/model.bin
[ "$(stat -c %s /root/m/model.bin)" = "$(cat .dev/z/model.size)" ] || { echo "model.bin: wrong size (call 1 ran on another machine?)"; exit 1; }
S=.dev/z/samples; R=engine/tests/data/faster_whisper_greedy.json; VAR=${VAR:-VERBATIM_ATTENTION_COOP_HELD}
for m in ${MODES-off ngram q4 q8 nots var}; do
  case $m in
    off) e=; a=;; ngram) e=; a="--speculative ngram";; q4) e=; a="--speculative self-q4";;
    q8) e=; a="--speculative self-q8";; nots) e=; a=--no-timestamps;;
    var) e="$VAR=1"; a=;; var_nots) e="$VAR=1"; a=--no-timestamps;;
    *) echo "unknown mode $m"; continue;;
  esac
  env $e timeout 200 $V transcribe --model /root/m --json $a $S/*.wav > $OUT/t_$m.json 2> $OUT/t_$m.err
  rc=$?; case $a in --no-timestamps) ref=no_timestamps;; *) ref=timestamps;; esac
  echo "== $m rc=$rc $(python3 bench/lent/compare_transcripts.py $R $OUT/t_$m.json $ref)"
done
for h in ${VALUES-1 0 1 0}; do
  env $VAR=$h timeout 90 $V bench --model /root/m --batches 3 --steps 16 --file $S/jfk.wav > $OUT/jfk_$h.txt 2>&1
  echo "== jfk $VAR=$h rc=$?"
  grep -E "^\| encoder|^\| the same windows|^\| decode, |^\| attention_coop|end to end|real-time" $OUT/jfk_$h.txt | cut -c1-150
done
[ -n "$E2E" ] && bash bench/lent/e2e.sh
# At most 8 files come back from $OUT: the outputs go back as one archive.
tar czf /tmp/samples.$$.tgz -C $OUT --exclude='*.tgz' . && find $OUT -maxdepth 1 -type f ! -name '*.tgz' -delete && mv /tmp/samples.$$.tgz $OUT/
