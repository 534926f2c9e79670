"""The distribution packages a built image holds, read from its own dpkg database.

The database is /var/lib/dpkg/status as the image's layers leave it, copied out of a created (never
started) container by the Docker engine (images/build/docker.py read_image_file). Nothing from the
image runs on the build host to read it, and it is what `dpkg-query -W` itself reads: one paragraph
per package, `Field: value` lines, continuation lines indented. Only packages whose Status ends in
`installed` are in the image; `deinstall ok config-files` leaves a paragraph but no package.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

STATUS_PATH = "/var/lib/dpkg/status"
OS_RELEASE_PATH = "/etc/os-release"


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    source: str = ""          # the source package's name when it differs ("gcc-12" for libgomp1)
    source_version: str = ""  # its version when it differs from the binary's

    def purl(self, vendor: str, codename: str = "") -> str:
        """Package URL of type deb (purl-spec types/deb-definition.json): vendor namespace, arch
        qualifier, the distro's codename as its examples write it."""
        qualifiers = f"?arch={quote(self.architecture, safe='')}"
        if codename:
            qualifiers += f"&distro={quote(codename, safe='')}"
        return f"pkg:deb/{vendor.lower()}/{self.name.lower()}@{quote(self.version, safe=':.~-_')}{qualifiers}"


def paragraphs(text: str) -> list[dict[str, str]]:
    """Debian control-file paragraphs: field -> value (continuation lines joined with newlines)."""
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if cur:
                out.append(cur)
            cur, last = {}, ""
        elif line[0] in " \t":
            if last:
                cur[last] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            last = key.strip()
            cur[last] = value.strip()
    if cur:
        out.append(cur)
    return out


def installed(status_text: str) -> list[DebPackage]:
    """Every installed package of a dpkg status file, sorted by name then architecture."""
    pkgs = []
    for p in paragraphs(status_text):
        if not p.get("Package") or p.get("Status", "").split()[-1:] != ["installed"]:
            continue
        src_name, src_version = "", ""
        if p.get("Source"):
            # "Source: gcc-12" or "Source: gcc-12 (12.2.0-14)" (dpkg writes the version when it differs)
            head, _, rest = p["Source"].partition(" (")
            src_name, src_version = head.strip(), rest.rstrip(")").strip()
        pkgs.append(DebPackage(name=p["Package"], version=p.get("Version", ""), architecture=p.get("Architecture", ""),
                               source=src_name, source_version=src_version))
    return sorted(pkgs, key=lambda d: (d.name, d.architecture))


def os_release(text: str) -> dict[str, str]:
    """/etc/os-release as a dict (os-release(5): KEY=value, values optionally quoted)."""
    fields = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip().strip('"').strip("'")
    return fields
