"""stage_table.py OUTPUT: the stages of `verbatim transcribe --timings` over several files,
one row per stage with each run's ms (and the stages' sum, GPU open and model load aside)."""
import sys, re
runs = []; cur = None
for line in open(sys.argv[1]):
    if line.startswith("timings for"): cur = {}; runs.append(cur); continue
    m = re.match(r"^(\S.*?)\s+(-?[0-9.]+)$", line.rstrip())
    if cur is not None and m and not line.startswith(("stage", "tokens", "total")): cur[m.group(1)] = float(m.group(2))
if not runs: print("no timings"); sys.exit()
names = [k for k in runs[0]] + ["total"]
for r in runs: r["total"] = sum(v for k, v in r.items() if k not in ("GPU open", "model load", "total"))
for n in names:
    print(f"  {n:<14}", " ".join(f"{r.get(n, float('nan')):6.1f}" for r in runs))
