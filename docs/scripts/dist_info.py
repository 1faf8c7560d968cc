"""Make this checkout's package metadata importable without installing it (the GPU machine has
no package index): a ``kernel_tuner_service-<version>.dist-info`` folder in DIR with the entry
points of pyproject.toml, so that ``importlib.metadata`` finds the families it declares.

    python3 docs/scripts/dist_info.py /tmp/site     # then PYTHONPATH=$PWD:/tmp/site
"""

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(target: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    folder = Path(target) / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    lines = []
    for group, points in project.get("entry-points", {}).items():
        lines += [f"[{group}]"] + [f"{name} = {value}" for name, value in points.items()] + [""]
    (folder / "entry_points.txt").write_text("\n".join(lines))
    print(f"wrote {folder}")


if __name__ == "__main__":
    main(sys.argv[1])
