"""Reading a candidate kernel from a file: its kind and language from the suffix, by the registry."""

from __future__ import annotations

from pathlib import Path

from kfoundry.core.errors import CandidateError
from kfoundry.core.languages import UnknownLanguage, check_language, known_languages, language_for_suffix
from kfoundry.core.models import DEFAULT_LANGUAGE, Candidate, ParamValue


def read_candidate(
    path: str | Path, params: dict[str, ParamValue] | None = None, language: str | None = None
) -> Candidate:
    """A candidate from a file, its language from the registry (:mod:`kfoundry.core.languages`).

    ``.py`` is a KernelBench ``ModelNew``: its language is the one its stem ends with (``softmax_cuda.py``),
    else ``language`` (the backend's), else the default. Any other suffix is a native kernel of the
    language registered for it (``.cl``, ``.cu``...). An unknown suffix or language is one line.
    """
    p = Path(path)
    if not p.is_file():
        raise CandidateError(f"candidate file not found: {p}")
    try:
        source = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CandidateError(f"cannot read candidate {p}: {exc}") from None
    where = f"candidate {p}"
    if p.suffix == ".py":
        named = [name for name in known_languages() if p.stem.endswith(f"_{name}")]
        chosen = max(named, key=len) if named else (language or DEFAULT_LANGUAGE)
        return Candidate(
            source=source,
            kind="kernelbench",
            language=check_language(chosen, where),
            params=params or {},
            label=p.name,
        )
    try:
        spec = language_for_suffix(p.suffix)
    except UnknownLanguage as exc:
        raise CandidateError(f"{p}: unknown candidate type: {exc} (or .py, a ModelNew)") from None
    if spec.candidate_kind == "python":
        raise CandidateError(f"{p}: a {spec.name} candidate is a ModelNew .py file")
    return Candidate(source=source, kind="native", language=spec.name, params=params or {}, label=p.name)
