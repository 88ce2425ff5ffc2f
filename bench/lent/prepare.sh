#!/usr/bin/env bash
# Prepare what the lent GPU machine's calls carry (all in ignored folders, see README.md):
#   .gl       the Vulkan/GL/ALSA loader packages (amd64), unpacked there at each call
#   .dev/y    the stripped, gzipped `verbatim` and engine test binaries, model.bin's first half
#   .dev/z    model.bin's second half, the model's small files, the shared samples,
#             `verbatim` again (for a call that finds a fresh machine)
# Builds release binaries from the working tree first (two cores: ~40 min from clean).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
model=${VERBATIM_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/verbatim/models/whisper-tiny.en}
samples=${SAMPLES:-../shared/samples}
[[ -f $model/model.bin ]] || packaging/fetch-model.sh "$model"
[[ -d $samples ]] || { echo "prepare: no samples at $samples (set SAMPLES)" >&2; exit 1; }

if [[ ! -d .gl ]] || ! ls .gl/libvulkan1_*.deb > /dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
    apt-get "${o[@]}" update > /dev/null
    (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 \
        libgles2 libasound2 libasound2-data > /dev/null)
fi

cargo build --release -p verbatim
tests=$(cargo test --release -p verbatim-engine --lib --no-run 2>&1 | grep -o "target/release/deps/engine-[0-9a-f]*" | tail -1 || true)
[[ -x $tests ]] || { echo "prepare: no engine test binary found" >&2; exit 1; }
mkdir -p .dev/y .dev/z/model .dev/z/samples
strip -o /tmp/verbatim.stripped target/release/verbatim
gzip -c /tmp/verbatim.stripped > .dev/y/verbatim.gz
cp .dev/y/verbatim.gz .dev/z/verbatim.gz
strip -o /tmp/engine-tests.stripped "$tests"
gzip -c /tmp/engine-tests.stripped > .dev/y/engine-tests.gz

# model.bin in two halves: a call carries at most 64 MiB.
size=$(stat -c %s "$model/model.bin")
half=$(( (size + 1) / 2 ))
head -c "$half" "$model/model.bin" > .dev/y/model.part1
tail -c +"$((half + 1))" "$model/model.bin" > .dev/z/model.part2
echo "$size" > .dev/z/model.size
cp "$model"/{config.json,tokenizer.json,vocabulary.txt} .dev/z/model/
cp "$samples"/*.wav .dev/z/samples/
du -sh .gl .dev/y .dev/z
