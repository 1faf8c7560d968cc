"""What a package of ``tuner export-torch`` runs, problem by problem, as ``tuner guard`` timed it::

    print("\\n".join(markdown(read_table("out/tuned_gemm"))))
    # tuner report --package out/tuned_gemm [--json]

One entry per tuned row and per sample between them (``tuner.answers.guard``), grouped by dtype
and flags, in shape order: the problem's key, the dimension its group varies in most (gemm's M,
the token count, where N and K are a layer's; attention's S), ours and the vendor's median, the
choice, and at a sample the rule's loss (ours' time over the vendor's, less one, where ours is
slower).
"""

from __future__ import annotations

from typing import Any, Mapping

NOT_GUARDED = "not timed against the vendor's path yet: `tuner guard DIR` times it on its GPU"


def entries(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The table's rows ("tuned") and samples ("sample"), by dtype, flags and shape."""
    found = [_entry(row, "tuned") for row in table["problems"]]
    found += [_entry(sample, "sample") for sample in table.get("samples", ())]
    varying = _varying_axes(found)
    for entry in found:
        axis = varying.get(_group(entry))
        entry["varying"] = None if axis is None else {"dim": axis, "value": entry["shape"][axis]}
    return sorted(found, key=lambda e: (e["dtype"], sorted(e["flags"].items()), len(e["shape"]), e["shape"]))


def document(table: Mapping[str, Any]) -> dict[str, Any]:
    """``tuner report --package --json``'s document."""
    return {"family": table["family"], "gpu": table["stamp"]["gpu"], "guard": table.get("guard"),
            "problems": entries(table)}


def markdown(table: Mapping[str, Any]) -> list[str]:
    """The lines of a markdown table of ``entries``, under a line saying what and when."""
    guard = table.get("guard")
    when = (f"timed against the vendor's path on the {guard['gpu']} on {guard['date']}, {guard['reps']} repetitions"
            if guard else NOT_GUARDED)
    lines = [f"{table['family']} for the {table['stamp']['gpu']}: {when}", "",
             "| problem | kind | varying | ours ms | vendor ms | use | rule's loss | why |",
             "|---|---|---|---:|---:|---|---:|---|"]
    for e in entries(table):
        varying = f"dim {e['varying']['dim']}: {e['varying']['value']}" if e["varying"] else ""
        lost = "" if e["kind"] == "tuned" or e["loss"] is None else f"{e['loss']:+.1%}"
        lines.append(f"| {e['key']} | {e['kind']} | {varying} | {_ms(e['ours_ms'])} | {_ms(e['vendor_ms'])} "
                     f"| {e['use']} | {lost} | {e['reason']} |")
    return lines


def _entry(item: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {"key": item["key"], "kind": kind, "shape": list(item["shape"]), "dtype": item["dtype"],
            "flags": dict(item["flags"]), "ours_ms": item.get("ours_ms"), "vendor_ms": item.get("vendor_ms"),
            "use": item.get("use", "ours"), "loss": item.get("loss"), "reason": item.get("guard_reason", ""),
            "params": item.get("params"), "source": item.get("source", item["key"])}


def _group(entry: Mapping[str, Any]) -> tuple[Any, ...]:
    return entry["dtype"], tuple(sorted(entry["flags"].items())), len(entry["shape"])


def _varying_axes(found: list[dict[str, Any]]) -> dict[tuple[Any, ...], int]:
    """Each group's dimension of the most values (the lowest of several such); none in a group
    whose shapes are all one."""
    shapes: dict[tuple[Any, ...], list[list[int]]] = {}
    for entry in found:
        shapes.setdefault(_group(entry), []).append(entry["shape"])
    varying = {}
    for group, members in shapes.items():
        counts = [len({shape[axis] for shape in members}) for axis in range(group[2])]
        if max(counts, default=1) > 1:
            varying[group] = counts.index(max(counts))
    return varying


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


__all__ = ["NOT_GUARDED", "document", "entries", "markdown"]
