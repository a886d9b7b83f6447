"""What a person reads on a materialization in the Dagster UI that is no table: a chart.

Dagster has no image metadata; a markdown image with a data URI is its documented way to show
one (it opens from the metadata entry).
"""

from __future__ import annotations

import base64


def png_markdown(png: bytes, alt: str) -> str:
    """Inline the image: the Dagster UI renders markdown metadata, data URIs included."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"
