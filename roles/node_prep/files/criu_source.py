#!/usr/bin/env python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find the URL and SHA256 of CRIU's upstream source tarball in Debian's archive.

Uses apt itself, with a private configuration in a cache directory: the
mirror comes from this machine's own apt sources, the index signatures are
checked against the system keyring, and nothing of the system's apt state
is touched. Prints one JSON object:

    {"url": ..., "sha256": ..., "size": ..., "filename": ..., "version": ...}

Run it with python3 (the role does). Exit codes: 0 found, 1 not found / apt failed (the reason goes to stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def system_mirrors(etc: Path = Path("/etc/apt")) -> list[str]:
    """Debian archive URIs configured on this machine (deb822 and one-line)."""
    uris: list[str] = []
    for src in sorted((etc / "sources.list.d").glob("*.sources")):
        for line in src.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip().lower().startswith("uris:"):
                uris.extend(line.split(":", 1)[1].split())
    one_line = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list"))
    for src in one_line:
        if not src.is_file():
            continue
        for line in src.read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"^\s*deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
            if m:
                uris.append(m.group(1))
    # The security archive has no criu source of its own; the main archive does.
    seen: list[str] = []
    for uri in uris:
        uri = uri.rstrip("/")
        if "security" in uri or uri in seen:
            continue
        seen.append(uri)
    return seen


def resolve(version: str, suites: list[str], cache: Path, package: str = "criu") -> dict:
    mirrors = system_mirrors()
    if not mirrors:
        raise LookupError("no Debian archive URI found in /etc/apt sources")
    root = cache / "apt"
    for sub in ("etc/sources.list.d", "etc/apt.conf.d", "etc/preferences.d",
                "lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "etc/sources.list.d/warmstart.sources").write_text(
        "Types: deb-src\nURIs: {}\nSuites: {}\nComponents: main\nSigned-By: {}\n".format(
            " ".join(mirrors), " ".join(suites), KEYRING),
        encoding="utf-8")
    conf = root / "apt.conf"
    conf.write_text(
        'Dir::Etc::sourcelist "/dev/null";\n'
        f'Dir::Etc::sourceparts "{root}/etc/sources.list.d";\n'
        f'Dir::Etc::parts "{root}/etc/apt.conf.d";\n'
        f'Dir::Etc::preferencesparts "{root}/etc/preferences.d";\n'
        f'Dir::State::Lists "{root}/lists";\n'
        f'Dir::Cache "{root}/cache";\n'
        'Dir::State::status "/dev/null";\n'
        # Mirrors and archive snapshots may serve a Release file past its
        # Valid-Until date; signatures are still verified, and the tarball's
        # SHA256 is pinned by the caller.
        'Acquire::Check-Valid-Until "false";\n'
        'APT::Sandbox::User "root";\n',
        encoding="utf-8")
    env = dict(os.environ, APT_CONFIG=str(conf), LC_ALL="C")
    upd = subprocess.run(["apt-get", "-q", "update"], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    if upd.returncode != 0:
        raise LookupError("apt-get update with the private config failed: "
                          + (upd.stderr or upd.stdout).strip()[-800:])
    show = subprocess.run(["apt-cache", "showsrc", package], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    versions = re.findall(r"^Version:\s*(\S+)", show.stdout, flags=re.M)
    wanted = [v for v in versions if re.sub(r"^\d+:", "", v).split("-")[0].split("+")[0] == version]
    if not wanted:
        raise LookupError(f"no source package {package} {version} in suites {', '.join(suites)} "
                          f"(found: {', '.join(versions) or 'none'})")
    uris = subprocess.run(["apt-get", "source", "--print-uris", f"{package}={wanted[0]}"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    for line in uris.stdout.splitlines():
        m = re.match(r"^'(\S+)'\s+(\S+\.orig\.tar\.\w+)\s+(\d+)\s+SHA256:([0-9a-f]{64})", line)
        if m:
            return {"url": m.group(1), "filename": m.group(2), "size": int(m.group(3)),
                    "sha256": m.group(4), "version": version, "source_version": wanted[0]}
    raise LookupError(f"apt listed no upstream tarball for {package}={wanted[0]}: "
                      + (uris.stderr or uris.stdout).strip()[-800:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="upstream CRIU version, e.g. 4.2.1")
    parser.add_argument("--suite", action="append", dest="suites",
                        help="archive suites to search (repeatable; default: unstable testing)")
    parser.add_argument("--cache", type=Path,
                        default=Path(os.path.expanduser("~/.cache/warmstart/criu")),
                        help="directory for the private apt state")
    args = parser.parse_args()
    if not shutil.which("apt-get"):
        print("criu_source: apt-get not found: this resolver needs a Debian/Ubuntu builder; "
              "set node_prep_criu_source_url instead", file=sys.stderr)
        return 1
    try:
        found = resolve(args.version, args.suites or ["unstable", "testing"], args.cache)
    except (LookupError, OSError, subprocess.SubprocessError) as exc:
        print(f"criu_source: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
