"""The zip the slides' images are handed out in: the page's images (``SLIDES_JS``'s, as data URLs)
and the server's own grid SVG, each checked for what it claims to be before anything is written.
Its cost is linear in the request: the images are counted before any is decoded, and their size is
kept as a running total."""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import zipfile
from pathlib import Path
from urllib.parse import unquote
from xml.parsers import expat

from .slides import PLOT_IDS

MAX_SLIDES_BYTES = 40 * 2**20  # every decoded image together
# What SLIDES_JS makes at most: the grid and each plot, as SVG and as PNG.
MAX_SLIDES_IMAGES = 2 * (1 + len(PLOT_IDS))
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\.(png|svg)")
_SVG = "http://www.w3.org/2000/svg svg"  # expat's name of the root, with its namespace


class _Refused(Exception):
    """Raised by a parser handler: the document declares something the zip does not take."""


def _svg_bytes(data: bytes, name: str) -> bytes:
    """``data`` if it is an SVG document with no DOCTYPE or entity: nothing for a viewer's parser to
    expand. Checked by an XML parser, so on the text as any reader decodes it, whatever its
    encoding (a byte order mark, UTF-16, an XML declaration's); one the parser cannot read is refused."""
    parser = expat.ParserCreate(namespace_separator=" ")
    roots: list[str] = []

    def declared(*_: object) -> None:
        raise _Refused(f"{name}: an SVG with a DOCTYPE or entities is refused")

    parser.StartDoctypeDeclHandler = parser.EntityDeclHandler = declared
    parser.StartElementHandler = lambda tag, _: roots or roots.append(tag)
    try:
        parser.Parse(data, True)
    except _Refused as refused:
        raise ValueError(str(refused)) from None
    except (expat.ExpatError, ValueError) as error:  # ValueError: an encoding expat does not know
        raise ValueError(f"{name}: not a well-formed SVG ({error})") from None
    if roots[:1] != [_SVG]:
        raise ValueError(f"{name}: not an SVG document (its root is {(roots or ['nothing'])[0]})")
    return data


def _decode(name: str, url: object) -> bytes:
    """The bytes of a PNG or SVG data URL named ``name`` (…png or …svg, as its media type says)."""
    if not isinstance(name, str) or not isinstance(url, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{str(name)[:80]!r}: an image needs a plain file name ending .png or .svg and a data URL")
    head, _, payload = url.partition(",")
    kind = name.rsplit(".", 1)[1]
    media = {"png": "data:image/png", "svg": "data:image/svg+xml"}[kind]
    if not head.startswith(media):
        raise ValueError(f"{name}: not a {kind.upper()} data URL")
    try:
        data = base64.b64decode(payload, validate=True) if head.endswith(";base64") else unquote(payload).encode()
    except (binascii.Error, ValueError):
        raise ValueError(f"{name}: its data URL does not decode") from None
    if kind == "png" and not data.startswith(_PNG_MAGIC):
        raise ValueError(f"{name}: not a PNG image")
    return _svg_bytes(data, name) if kind == "svg" else data


def slides_zip(images_json: object, grid_svg: object, folder: Path) -> Path:
    """Write ``grid.svg`` (the server's own ``grid_svg``) and every image of ``images_json``
    ({file name: PNG or SVG data URL}, as ``SLIDES_JS`` returns it) into one zip in ``folder``;
    its path. Anything else (another kind of data, a bad name, more than ``MAX_SLIDES_IMAGES``
    images or ``MAX_SLIDES_BYTES`` in all) is refused with a ValueError before anything is written."""
    if not isinstance(grid_svg, str) or not grid_svg:
        raise ValueError("there is no grid to export: run something (or import a trace) first")
    if not isinstance(images_json, (str, type(None))) or len(images_json or "") > 2 * MAX_SLIDES_BYTES:
        raise ValueError(f"the images are not a JSON text of at most {2 * MAX_SLIDES_BYTES // 2**20} MiB")
    try:
        images = json.loads(images_json or "{}")
    except (json.JSONDecodeError, RecursionError):
        raise ValueError("the images are not a JSON object") from None
    if not isinstance(images, dict):
        raise ValueError("the images are not a JSON object of file name: data URL")
    if len(images) > MAX_SLIDES_IMAGES:
        raise ValueError(f"{len(images)} images: the slides hold at most {MAX_SLIDES_IMAGES} (the grid and each "
                         f"plot, as SVG and PNG)")
    files = {"grid.svg": _svg_bytes(grid_svg.encode(), "grid.svg")}
    total = len(files["grid.svg"])
    for name, url in images.items():
        if name == "grid.svg":  # the page's copy of the grid's SVG: the server's own is written
            continue
        files[name] = _decode(name, url)
        total += len(files[name])
        if total > MAX_SLIDES_BYTES:
            raise ValueError(f"the images are over {MAX_SLIDES_BYTES // 2**20} MiB")
    digest = hashlib.sha256(b"".join(files[name] for name in sorted(files))).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"slides-{digest}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path
