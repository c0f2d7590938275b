"""Put the project.yml assets in place without the internet, then check their MD5.

    python -m scripts.copy_assets --shared ../shared/data --only assets/conll2003

For every asset in project.yml whose `dest` starts with --only: if the file is there
with the right checksum, nothing is done; else it is copied from the offline copy
`<shared>/<dest without the leading assets/>` (e.g. ../shared/data/conll2003/train.txt);
else it is downloaded from the asset's `url`. The checksum is then verified. Afterwards
`python -m spacy project assets` finds the files present and skips its downloads.
The copied files stay out of git (.gitignore lists assets/conll2003/).
"""
import argparse
import hashlib
import shutil
import sys
import urllib.request
from pathlib import Path
from typing import List, Optional


def md5(path: Path) -> str:
    digest = hashlib.md5()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_assets(project_dir: Path) -> List[dict]:
    import srsly

    return list(srsly.read_yaml(project_dir / "project.yml").get("assets", []))


def fetch(asset: dict, project_dir: Path, shared: Optional[Path], timeout: float = 60.0) -> str:
    dest = project_dir / asset["dest"]
    checksum = asset.get("checksum")
    if dest.is_file() and (not checksum or md5(dest) == checksum):
        return "present"
    dest.parent.mkdir(parents=True, exist_ok=True)
    relative = Path(asset["dest"])
    if relative.parts and relative.parts[0] == "assets":
        relative = Path(*relative.parts[1:])
    source = (shared / relative) if shared else None
    if source is not None and source.is_file():
        shutil.copyfile(source, dest)
        how = f"copied from {source}"
    elif asset.get("url"):
        with urllib.request.urlopen(asset["url"], timeout=timeout) as response, dest.open("wb") as out:
            shutil.copyfileobj(response, out)
        how = f"downloaded from {asset['url']}"
    else:
        raise FileNotFoundError(f"{asset['dest']}: not found in {shared} and no url to download from")
    if checksum and md5(dest) != checksum:
        raise ValueError(f"{asset['dest']}: MD5 {md5(dest)} does not match project.yml's {checksum} ({how})")
    return how


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, help="folder holding offline copies (e.g. ../shared/data)")
    parser.add_argument("--only", default="", help="only assets whose dest starts with this (e.g. assets/conll2003)")
    parser.add_argument("--project-dir", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    assets = [a for a in load_assets(args.project_dir) if "dest" in a and a["dest"].startswith(args.only)]
    if not assets:
        print(f"no assets in project.yml under {args.only!r}: nothing to do")
        return 0
    failed = 0
    for asset in assets:
        try:
            print(f"{asset['dest']}: {fetch(asset, args.project_dir, args.shared)}")
        except Exception as err:  # report every asset, then fail
            failed += 1
            print(f"{asset['dest']}: FAILED: {err}", file=sys.stderr)
    if failed:
        print(f"{failed} asset(s) missing. Copy them by hand or run `python -m spacy project assets` "
              "on a machine with internet access.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
