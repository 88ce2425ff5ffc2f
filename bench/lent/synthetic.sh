# Call 1 on the lent machine (carry .gl and .dev/y): keep model.bin's first half and the
# binaries outside the checkout (/root/x, /root/w) for call 2, run the kernel tests that
# need the real GPU (TESTS: the test binary's filters), then `verbatim bench --synthetic`
# for each geometry in GEOS with each of VALUES given to the switch VAR, in turn (the
# machine drifts: alternate them). STATS=1 adds the driver's compiler statistics (with
# VAR=1); SKIP_TESTS=1 skips the tests. Full outputs go to $OUT, the key rows to stdout.
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
mkdir -p /root/x /root/w
[ -f .dev/y/model.part1 ] && cp .dev/y/model.part1 /root/x/
gunzip -c .dev/y/verbatim.gz > /root/w/verbatim && chmod +x /root/w/verbatim || exit 1
if [ -f .dev/y/engine-tests.gz ] && [ -z "$SKIP_TESTS" ]; then
  gunzip -c .dev/y/engine-tests.gz > /root/w/engine-tests && chmod +x /root/w/engine-tests
  echo "== device tests"
  (cd engine && timeout 240 /root/w/engine-tests ${TESTS:-kernels::tests::attention kernels::tests::coop} 2>&1 |
    tee $OUT/tests.txt | grep -E "^test |test result|panicked|FAIL" | tail -40)
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
i=0
for g in ${GEOS:-tiny small}; do for h in ${VALUES-1 0 1 0}; do i=$((i+1))
  env ${VAR:-VERBATIM_ATTENTION_COOP_HELD}=$h timeout 120 /root/w/verbatim bench --synthetic $g --batches ${BATCHES:-3} --steps 16 > $OUT/bench_${g}_${h}_$i.txt 2>&1
  echo "== $g ${VAR:-VERBATIM_ATTENTION_COOP_HELD}=$h ($i) rc=$?"
  grep -E "^\| encoder|^\| the same windows|^\| decode, |^\| attention_coop|^\| copy ceiling" $OUT/bench_${g}_${h}_$i.txt | cut -c1-150
done; done
if [ -n "$STATS" ]; then
  env ${VAR:-VERBATIM_ATTENTION_COOP_HELD}=1 timeout 120 /root/w/verbatim bench --synthetic tiny --batches 1 --steps 16 --pipeline-stats /tmp/ps > $OUT/stats.txt 2>&1
  echo "== stats rc=$?"; grep -E "attention|Compiler|^\| kernel" $OUT/stats.txt | cut -c1-200
fi
# At most 8 files come back from $OUT: the outputs go back as one archive.
tar czf /tmp/synthetic.$$.tgz -C $OUT --exclude='*.tgz' . && find $OUT -maxdepth 1 -type f ! -name '*.tgz' -delete && mv /tmp/synthetic.$$.tgz $OUT/
