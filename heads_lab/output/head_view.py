"""The interactive head view: one self-contained HTML page (inline CSS and JavaScript from
templates/head_view.html, the data as JSON in a <script id="heads-lab-data"> block) showing
every layer and head of one sentence; and BertViz's own head view where bertviz is installed."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heads_lab.config.sites import SITE, present
from heads_lab.output.files import write_atomic

DATA_ID = "heads-lab-data"  # id of the JSON block in head_view_html's page
TEMPLATE = Path(__file__).parent / "templates" / "head_view.html"


def _attention_arrays(attention: Mapping[str, Any], src_tokens: Sequence[str],
                      tgt_tokens: Sequence[str]) -> dict[str, np.ndarray]:
    """The sites' [layers, heads, n_query, n_key] arrays, checked against the tokens."""
    tokens = {"src": list(src_tokens), "tgt": list(tgt_tokens)}
    arrays = {}
    for site in present(attention):
        a = np.asarray(attention[site], dtype=float)
        q, k = tokens[SITE[site].query], tokens[SITE[site].key]
        expected = (len(q), len(k))
        if a.ndim != 4 or a.shape[2:] != expected or 0 in a.shape[:2]:
            raise ValueError(f"attention[{site!r}] has shape {a.shape}: expected [layers, heads, "
                             f"{expected[0]}, {expected[1]}] for {SITE[site].label} with "
                             f"{len(src_tokens)} source and {len(tgt_tokens)} target tokens")
        if not np.isfinite(a).all():
            raise ValueError(f"attention[{site!r}] has NaN or infinite weights")
        arrays[site] = a
    if not arrays:
        raise ValueError("no attention site to show")
    return arrays


def head_view_html(attention: Mapping[str, Any], src_tokens: Sequence[str],
                   tgt_tokens: Sequence[str], path: Path,
                   title: str = "heads-lab head view",
                   notes: Mapping[str, Sequence[Sequence[str]]] | None = None) -> Path:
    """One self-contained HTML page (no network) showing every layer and head of one sentence:
    site and layer menus, a coloured toggle per head, query tokens left and key tokens right
    joined by lines whose opacity is the weight; hovering a token keeps only its lines.
    `notes` (site → [layer][head] text, e.g. a head's role and scores) are the head buttons'
    tooltips."""
    arrays = _attention_arrays(attention, src_tokens, tgt_tokens)
    tokens = {"src": [str(t) for t in src_tokens], "tgt": [str(t) for t in tgt_tokens]}
    data = {
        "title": title,
        "src_tokens": tokens["src"],
        "tgt_tokens": tokens["tgt"],
        "sites": [{"name": site, "label": SITE[site].label,
                   "queries": tokens[SITE[site].query], "keys": tokens[SITE[site].key],
                   "weights": np.round(a, 6).tolist(),
                   **({"notes": [list(map(str, row)) for row in notes[site]]}
                      if notes and site in notes else {})}
                  for site, a in arrays.items()],
    }
    # <, > and & as \u escapes: no token can close the block or start markup; JSON.parse and
    # json.loads read them back as the characters.
    blob = (json.dumps(data, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))
    fills = {"TITLE": html.escape(title), "DATA_ID": DATA_ID, "DATA": blob}
    template = TEMPLATE.read_text(encoding="utf-8")
    page = re.sub(r"@(TITLE|DATA_ID|DATA)@", lambda m: fills[m.group(1)], template)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, page)
    return path


def bertviz_head_view(attention: Mapping[str, Any], src_tokens: Sequence[str],
                      tgt_tokens: Sequence[str], path: Path) -> Path | None:
    """BertViz's head view (Vig 2019) written to `path`, or None when bertviz is not installed.
    BertViz takes one layer range for all sites: with unequal depths the shallower one wins.
    Its page loads require.js and d3 from a CDN; head_view_html needs no network."""
    try:
        import bertviz  # lazy: optional dependency (bertviz, not installed by default)
        import torch  # lazy: start-up time (torch); bertviz takes torch tensors
    except ImportError:
        return None
    arrays = _attention_arrays(attention, src_tokens, tgt_tokens)

    def layers(site: str) -> list | None:
        if site not in arrays:
            return None
        return [torch.as_tensor(layer[None], dtype=torch.float32) for layer in arrays[site]]

    depth = min(a.shape[0] for a in arrays.values())
    if "lm-self" in arrays:  # a decoder-only model: one stack, its own tokens
        view = bertviz.head_view(attention=layers("lm-self"), tokens=list(src_tokens),
                                 include_layers=list(range(depth)), html_action="return")
    else:
        view = bertviz.head_view(encoder_attention=layers("enc-self"),
                                 decoder_attention=layers("dec-self"),
                                 cross_attention=layers("dec-enc"),
                                 encoder_tokens=list(src_tokens),
                                 decoder_tokens=list(tgt_tokens),
                                 include_layers=list(range(depth)), html_action="return")
    body = _script_safe(getattr(view, "data", view))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head><body>\n'
                    f"{body}\n</body></html>\n", encoding="utf-8")
    return path


def _script_safe(body: str) -> str:
    """BertViz writes its data into a <script> as plain JSON (`params = {...}`), so a token
    holding "</script>" would end the script there. Each such JSON object is rewritten with
    "</" as "<\\/", the same string to JavaScript."""
    out, at = [], 0
    for found in re.finditer(r"params = ", body):
        start = found.end()
        if start < at:
            continue
        try:
            _, end = json.JSONDecoder().raw_decode(body, start)
        except ValueError:
            continue
        out += [body[at:start], body[start:end].replace("</", "<\\/")]
        at = end
    return "".join(out) + body[at:]
