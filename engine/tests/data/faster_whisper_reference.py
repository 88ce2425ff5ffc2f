"""Reference transcripts: faster-whisper 1.2.1 (CTranslate2 4.8.5, float32 on the CPU),
greedy decoding at temperature 0, with the same tiny.en weights Verbatim uses.

    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install faster-whisper==1.2.1
    /tmp/refenv/bin/python engine/tests/data/faster_whisper_reference.py \
        ~/.cache/verbatim/models/whisper-tiny.en ../shared/samples > engine/tests/data/faster_whisper_greedy.json

Writes, per WAV file and mode (timestamps / no timestamps), the segments with their
tokens, which the end-to-end tests compare against word for word.
"""
import json
import sys
from pathlib import Path

import ctranslate2
import faster_whisper
from faster_whisper import WhisperModel


def main():
    model_dir, samples = sys.argv[1], Path(sys.argv[2])
    model = WhisperModel(model_dir, device="cpu", compute_type="float32")
    out = {
        "generator": f"faster-whisper {faster_whisper.__version__}, ctranslate2 {ctranslate2.__version__}, "
        "compute_type float32, beam_size 1, temperature 0.0, other options default",
        "files": {},
    }
    for wav in sorted(samples.glob("*.wav")):
        entry = {}
        for mode, without in (("timestamps", False), ("no_timestamps", True)):
            segments, _ = model.transcribe(
                str(wav), beam_size=1, temperature=0.0, without_timestamps=without
            )
            entry[mode] = [
                {"start": round(s.start, 3), "end": round(s.end, 3), "text": s.text, "tokens": s.tokens}
                for s in segments
            ]
        out["files"][wav.name] = entry
        print(wav.name, file=sys.stderr)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
