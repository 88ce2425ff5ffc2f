"""compare_transcripts.py REFERENCE.json OURS.json timestamps|no_timestamps

Counts the files of `verbatim transcribe --json` whose segments equal the reference's
(faster-whisper's greedy transcripts, engine/tests/data/faster_whisper_greedy.json): the
same text, leading space aside, and the same times within 1 ms, as end_to_end.rs holds."""
import json, sys, os
ref = json.load(open(sys.argv[1]))["files"]; mode = sys.argv[3]
try:
    got = json.load(open(sys.argv[2]))
except Exception as e:
    print("unreadable:", e); sys.exit()
ok = 0; bad = []
for f in got["files"]:
    name = os.path.basename(f["path"])
    if "error" in f: bad.append(name + ": " + f["error"]); continue
    want = ref[name][mode]
    g = [(s["start"], s["end"], s["text"].strip()) for s in f["segments"]]
    w = [(s["start"], s["end"], s["text"].strip()) for s in want]
    same = len(g) == len(w) and all(a[2] == b[2] and abs(a[0]-b[0]) < 1e-3 and abs(a[1]-b[1]) < 1e-3 for a, b in zip(g, w))
    if same: ok += 1
    else: bad.append(name)
print(f"{ok}/{len(got['files'])} equal", "; differ:", bad if bad else "none")
