"""Fonts for the characters on a picture's axes: installed fonts that draw them, or legible stand-ins where none does."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

BASE = "DejaVu Sans Mono"  # matplotlib's own monospaced font: Latin, Greek, Cyrillic, no Chinese
INSTALL_HINT = "install a font that has them (Debian/Ubuntu: apt-get install fonts-noto-cjk) and run again"


def _manager():
    from matplotlib import font_manager  # imported on first use: a run that draws no picture never loads matplotlib
    return font_manager


@lru_cache(maxsize=None)
def _charmap(path: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font
    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # a font file matplotlib cannot read
        return frozenset()


@lru_cache(maxsize=None)
def _fonts() -> tuple[tuple[str, str], ...]:
    """(family name, file) of every installed font, matplotlib's own monospaced font first. matplotlib's "Last
    Resort" font maps every code point to a placeholder box: it draws nothing legible, so it does not count."""
    entries = {(f.name, f.fname) for f in _manager().fontManager.ttflist if not f.name.startswith("Last Resort")}
    return tuple(sorted(entries, key=lambda e: (e[0] != BASE, e)))


@lru_cache(maxsize=None)
def _system_font_files() -> tuple[str, ...]:
    """Font files on this machine that matplotlib's cached font list may not know yet (installed since it was made)."""
    known = {path for _, path in _fonts()}
    regular_first = lambda path: ("Regular" not in Path(path).name, path)  # noqa: E731
    return tuple(sorted(set(_manager().findSystemFonts()) - known, key=regular_first))


@lru_cache(maxsize=None)
def font_for(ch: str) -> str | None:
    """The first installed font (BASE first) that has a glyph for this character, or None. A font installed after
    matplotlib listed the fonts is found too, and added to its list so that it can draw."""
    found = next((name for name, path in _fonts() if ord(ch) in _charmap(path)), None)
    if found is None:
        path = next((path for path in _system_font_files() if ord(ch) in _charmap(path)), None)
        if path is not None:
            _manager().fontManager.addfont(path)
            found = _manager().FontProperties(fname=path).get_name()
    return found


def label(ch: str) -> str:
    """How a character is written on an axis: a newline, a space or a tab made visible."""
    return {"\n": "\\n", " ": "␣", "\t": "\\t"}.get(ch, ch)


def tick_labels(text: str) -> tuple[list[str], list[str], list[str]]:
    """(a label per character, font families in fallback order, characters no installed font draws). A character
    without a font is shown as its code point (花 -> 82b1), so the axis stays legible and matplotlib does not warn."""
    families, missing, shown = [BASE], [], []
    for written in map(label, text):
        drawable = True
        for ch in written:
            name = font_for(ch)
            if name is None:
                drawable = False
                missing.append(ch)
            elif name not in families:
                families.append(name)
        shown.append(written if drawable else "".join(f"{ord(ch):x}" for ch in written))
    return shown, families, list(dict.fromkeys(missing))


def missing_note(text: str) -> str | None:
    """One line for the user when some characters of text cannot be drawn on this machine."""
    missing = tick_labels(text)[2]
    if not missing:
        return None
    return (f"note: no installed font draws {''.join(missing[:10])}{'...' if len(missing) > 10 else ''}; the "
            f"attention pictures label them by code point; {INSTALL_HINT}")
