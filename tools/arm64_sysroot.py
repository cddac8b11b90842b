"""Builds a folder in which an aarch64 Python runs the tests under qemu-user, and prints
the path of a wrapper that runs it (``make test-cpu CPU=neoverse-n1``).

The folder (``.cpu-emulation/arm64`` by default, git-ignored) holds, from the registries
only:

* Debian's arm64 packages of python3.11 and everything it depends on (plus libstdc++6,
  which onnxruntime's and ml_dtypes' wheels link), fetched with ``apt-get download`` through
  an apt configuration of its own (the host's sources, arm64 only, its own lists and
  state: the host's apt setup is left as it is) and unpacked with ``dpkg -x``;
* the aarch64 wheels of requirements.lock's pins, checked against the lock's hashes and
  unpacked into ``usr/lib/python3/dist-packages`` (a pin without an aarch64 wheel is
  named and left out);
* dqtool itself as the work tree (a ``.pth`` line): without its compiled extension, which
  is x86-64 here, dqtool runs on NumPy with the same bytes;
* for each CPU model, a prefix folder with the emulated CPU's ``proc/cpuinfo``: qemu 7.2
  shows the guest the host's /proc/cpuinfo, onnxruntime's cpuinfo library cannot parse
  an x86 one and aborts at import, and QEMU_LD_PREFIX makes the guest open
  ``<prefix>/proc/cpuinfo`` first (it maps every absolute path it finds under the
  prefix, /proc included).

Each stage leaves a stamp keyed by what it was built from (the package list, the lock's
hash), so a second run only writes the wrapper.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# python3.11 pulls in libc, libssl, libffi, zlib, sqlite and the rest; onnxruntime's wheel
# links libstdc++ and libgcc_s, which python3.11 does not need.
ROOT_PACKAGES = ("python3.11", "libstdc++6", "libgcc-s1")
# bookworm's glibc is 2.36: every manylinux tag up to it runs on the unpacked libc (pip
# 23.2 does not expand a --platform to the older glibc tags itself, so all are named).
WHEEL_PLATFORMS = ("manylinux2014_aarch64",
                   *(f"manylinux_2_{v}_aarch64" for v in range(17, 37)))
SITE = Path("usr/lib/python3/dist-packages")


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """``cmd``, its output on stderr unless captured: stdout carries only the wrapper's
    path (the Makefile reads it)."""
    if "capture_output" not in kw:
        kw["stdout"] = sys.stderr
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload]


def _stamp(folder: Path, stage: str, key: str) -> Path | None:
    """The stamp file to write after ``stage``, or None when it is done already."""
    stamp = folder / f".stamp-{stage}"
    if stamp.exists() and stamp.read_text() == key:
        return None
    return stamp


# ---- Debian packages -------------------------------------------------------------------

def _apt_options(apt: Path) -> list[str]:
    """apt-get/apt-cache options for an arm64-only view of the host's sources, with lists,
    caches and an empty dpkg status of its own (so dependencies resolve from scratch and
    nothing of the host's apt state changes)."""
    for d in ("lists/partial", "archives/partial"):
        (apt / d).mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    return ["-o", "APT::Architecture=arm64", "-o", "APT::Architectures::=arm64",
            "-o", f"Dir::State={apt}", "-o", f"Dir::State::Lists={apt}/lists",
            "-o", f"Dir::State::status={apt}/status", "-o", f"Dir::Cache={apt}",
            "-o", f"Dir::Cache::Archives={apt}/archives",
            "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
            # running as root, apt would drop to _apt, which cannot write here
            "-o", "APT::Sandbox::User=root", "-q"]


def _closure(opts: list[str]) -> list[str]:
    """The packages ROOT_PACKAGES depend on, recursively (Depends and Pre-Depends)."""
    out = run(["apt-cache", *opts, "depends", "--recurse", "--no-recommends", "--no-suggests",
               "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances",
               *ROOT_PACKAGES], capture_output=True).stdout
    names = {line.split(":")[0] for line in out.splitlines()
             if line and not line[0].isspace() and not line.startswith("<")}
    return sorted(names)


def debian(folder: Path, root: Path) -> None:
    apt = folder / "apt"
    opts = _apt_options(apt)
    key = " ".join(ROOT_PACKAGES)
    stamp = _stamp(folder, "debs", key)
    if stamp is None:
        return
    run(["apt-get", *opts, "update"])
    packages = _closure(opts)
    debs = folder / "debs"
    debs.mkdir(exist_ok=True)
    run(["apt-get", *opts, "download", *packages], cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg", "-x", str(deb), str(root)])
    print(f"arm64 sysroot: {len(packages)} Debian packages unpacked", file=sys.stderr)
    stamp.write_text(key)


# ---- wheels ----------------------------------------------------------------------------

def _pins(lock: Path) -> list[tuple[str, list[str]]]:
    """(``name==version``, its hashes) for each pin of the lock."""
    pins: list[tuple[str, list[str]]] = []
    for line in lock.read_text().splitlines():
        text = line.split("#")[0].strip().rstrip("\\").strip()
        if not text:
            continue
        if text.startswith("--hash="):
            pins[-1][1].append(text.removeprefix("--hash="))
        elif "==" in text:
            pins.append((text.split(";")[0].strip(), []))
    return pins


def _download(pin: str, hashes: list[str], wheels: Path) -> bool:
    """The pin's aarch64 (or pure-Python) wheel into ``wheels``, checked against the
    lock's hashes; False where no such wheel exists."""
    req = wheels / "req.txt"
    req.write_text(f"{pin} " + " ".join(f"--hash={h}" for h in hashes) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:",
         *(a for p in WHEEL_PLATFORMS for a in ("--platform", p)),
         "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
         "--require-hashes", "-r", str(req), "-d", str(wheels)],
        text=True, capture_output=True)
    return done.returncode == 0


def _unpack(wheel: Path, site: Path) -> None:
    """A wheel into the site folder; its ``.data/purelib`` and ``platlib`` moved up (its
    scripts and headers are not needed to import it)."""
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    for data in site.glob("*.data"):
        for lib in ("purelib", "platlib"):
            if (data / lib).is_dir():
                shutil.copytree(data / lib, site, dirs_exist_ok=True)
        shutil.rmtree(data)


def wheels(folder: Path, root: Path, lock: Path) -> list[str]:
    """Downloads and unpacks the lock's wheels; returns the pins left out."""
    key = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = _stamp(folder, "wheels", key)
    missing_file = folder / "wheels-missing.txt"
    if stamp is None:
        return missing_file.read_text().split()
    site = root / SITE
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    dest = folder / "wheels"
    dest.mkdir(exist_ok=True)
    missing = []
    for pin, hashes in _pins(lock):
        if not _download(pin, hashes, dest):
            missing.append(pin)
    (dest / "req.txt").unlink(missing_ok=True)
    pinned = {p.split("==")[0].lower().replace("-", "_") + "-" + p.split("==")[1]
              for p, _ in _pins(lock)}
    for wheel in sorted(dest.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        if f"{name.lower()}-{version}" in pinned:  # an older lock's wheels stay out
            _unpack(wheel, site)
    # dqtool from the work tree, its NumPy path (the compiled extension is x86-64)
    (site / "dqtool-worktree.pth").write_text(f"{REPO}\n")
    missing_file.write_text("\n".join(missing) + "\n")
    stamp.write_text(key)
    return missing


# ---- /proc/cpuinfo and the wrapper --------------------------------------------------------

# /proc/cpuinfo of the CPU models qemu emulates, as Linux prints it: (variant, part,
# revision) of the MIDR (implementer Arm, 0x41) and the features qemu 7.2 gives each in its
# hwcaps (AT_HWCAP 0x119ffb and 0x8fb, read from /proc/self/auxv on 2026-11-28).
CPUS: dict[str, tuple[str, str, str, str]] = {
    "neoverse-n1": ("0x3", "0xd0c", "1", "fp asimd aes pmull sha1 sha2 crc32 atomics fphp "
                                         "asimdhp cpuid asimdrdm lrcpc dcpop asimddp"),
    "cortex-a72": ("0x0", "0xd08", "3", "fp asimd aes pmull sha1 sha2 crc32 cpuid"),
}


def cpuinfo(folder: Path, root: Path, cpu: str) -> Path:
    """The folder QEMU_LD_PREFIX names for ``cpu``: the root's top-level entries linked,
    and that CPU's ``proc/cpuinfo``. It must match the CPU qemu emulates: onnxruntime's
    cpuinfo library reads the part number there, and with the Neoverse N1's file under
    ``-cpu cortex-a72`` (no dot product) onnxruntime's first InferenceSession stopped on an illegal
    instruction, with the Cortex-A72's it ran (measured 2026-11-28)."""
    variant, part, revision, features = CPUS[cpu]
    prefix = folder / f"prefix-{cpu}"
    (prefix / "proc").mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        link = prefix / entry.name
        if entry.name != "proc" and not link.is_symlink():
            link.symlink_to(entry)
    blocks = [f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: {features}\n"
              f"CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: {variant}\n"
              f"CPU part\t: {part}\nCPU revision\t: {revision}\n"
              for i in range(os.cpu_count() or 1)]
    (prefix / "proc" / "cpuinfo").write_text("\n".join(blocks) + "\n")
    return prefix


def wrapper(root: Path, prefix: Path, cpu: str) -> Path:
    """A script running the root's python3.11 under qemu-aarch64 -cpu CPU at the lowest
    priority (the machine is shared), absolute paths looked up under ``prefix`` first.
    ``-0`` gives the guest the wrapper as argv[0], so ``sys.executable`` runs the emulated
    Python again (and its prefix is the root's usr); no user site of the host leaks in."""
    path = root / "usr" / "bin" / f"python-{cpu}"
    path.write_text(
        "#!/bin/sh\n"
        f"QEMU_LD_PREFIX='{prefix}' PYTHONNOUSERSITE=1 exec nice -n 19 "
        f"qemu-aarch64 -cpu '{cpu}' -0 '{path}' '{root}/usr/bin/python3.11' \"$@\"\n")
    path.chmod(0o755)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cpu", choices=sorted(CPUS), help="the qemu-aarch64 -cpu model")
    p.add_argument("--folder", type=Path, default=REPO / ".cpu-emulation" / "arm64")
    p.add_argument("--lock", type=Path, default=REPO / "requirements.lock")
    args = p.parse_args()
    folder = args.folder.resolve()
    root = folder / "root"
    root.mkdir(parents=True, exist_ok=True)
    debian(folder, root)
    missing = wheels(folder, root, args.lock)
    if missing:
        print("arm64 sysroot: no aarch64 wheel for " + ", ".join(missing), file=sys.stderr)
    print(wrapper(root, cpuinfo(folder, root, args.cpu), args.cpu))


if __name__ == "__main__":
    main()
