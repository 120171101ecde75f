"""A model named by its Hugging Face Hub id: ``ORG/NAME`` or ``ORG/NAME@REVISION``.

Only the repository's ``config.json`` is fetched, never weights, through ``huggingface_hub``'s
``hf_hub_download`` (the library made for it), so everything a user has set up for the Hub applies
unchanged: the standard cache (``HF_HOME`` / ``HF_HUB_CACHE``; a model already downloaded resolves
offline), ``HF_HUB_OFFLINE=1``, and ``HF_TOKEN`` or ``hf auth login`` for gated repositories. The
cached file's path names the commit it came from (``snapshots/<commit>/config.json``): that commit is
the model's ``revision``, recorded in every result made from it.

``huggingface_hub`` is imported only when a Hub id is resolved: the calculator in the browser ships
this module without the library and answers a Hub id with a pointer to pasting the config (its page
fetches the raw config itself where it can). Every failure is a ``UserError`` that says what to do;
nothing is written before the config is read, and no code of the repository is ever run
(``trust_remote_code`` is never set: a ``model_type`` transformers does not know is refused here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from reportgen.errors import UserError

#: ``ORG/NAME`` or ``ORG/NAME@REVISION`` (Hub repo names: letters, digits, ``-``, ``_``, ``.``; a
#: revision is a branch, a tag or a commit, which may hold ``/``)
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})"
                    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}))?")
#: a commit in a snapshot folder's name
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubConfig:
    repo: str
    #: what the user asked for (a branch, tag or commit; None: the default branch)
    requested: str | None
    #: the commit the config came from (the snapshot folder's name)
    commit: str | None
    path: Path
    config: dict

    @property
    def source(self) -> str:
        return f"hf://{self.repo}@{self.commit or self.requested or 'main'}"


#: a model's page or file on the Hub as a browser shows it (``https://huggingface.co/ORG/NAME``, with
#: ``/tree/REV``, ``/blob/REV/config.json`` or ``/resolve/REV/...``) and our own ``hf://ORG/NAME@REV``
#: (``HubConfig.source``): each names the same repository and revision as ``ORG/NAME@REV``
HUB_URL = re.compile(r"(?:(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/|hf://)(?!datasets/|spaces/)(?P<repo>[^/@?#\s]+/[^/@?#\s]+)"
                     r"(?:@(?P<at>[^?#\s]+)|/(?:tree|blob|resolve)/(?P<rev>[^/?#\s]+)(?:/[^?#\s]*)?)?/?(?:[?#]\S*)?")


def canonical(text: str) -> str:
    """``text`` as a Hub id ``ORG/NAME[@REVISION]`` when it is a Hub address (``HUB_URL``), else as given:
    a pasted ``https://huggingface.co/Qwen/Qwen3-14B`` is the model ``Qwen/Qwen3-14B``."""
    m = HUB_URL.fullmatch(str(text).strip())
    if not m:
        return text
    from urllib.parse import unquote

    revision = unquote(m.group("at") or m.group("rev") or "")
    return m.group("repo") + (f"@{revision}" if revision and revision != "main" else "")


def parse(text: str) -> tuple[str, str | None] | None:
    """``(repo, revision)`` when ``text`` has the form of a Hub id, else None."""
    m = HUB_ID.fullmatch(str(text).strip())
    if not m or ".." in m.group("repo") or m.group("repo").endswith((".json", ".yaml", ".yml")):
        return None
    return m.group("repo"), m.group("revision")


def fetch_config(repo: str, revision: str | None, known_ids: dict[str, str] | None = None) -> HubConfig:
    """The repository's ``config.json``, parsed: from the Hugging Face cache when it is there (no
    network, no wait: a config a user has downloaded answers at once, also offline), else downloaded
    into the cache (huggingface_hub retries an unreachable Hub for about 20 s before it gives up, so
    a line on stderr says it is fetching), and refused when it needs the repository's own code
    (``check_transformers_knows``). ``known_ids`` (Hub id -> catalog name) feeds the did-you-mean of
    a missing repository."""
    label = repo + (f"@{revision}" if revision else "")
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub import errors as hub_errors
    except ImportError:
        raise UserError(f"model {label!r}: a Hub id needs the huggingface_hub package",
                        hint="pip install huggingface_hub, or pass a catalog name (reportgen models) or a path "
                             "to the model's config.json") from None
    try:
        path = Path(hf_hub_download(repo, "config.json", revision=revision, local_files_only=True))
    except Exception:  # not cached (or not under that revision): ask the Hub
        path = None
    if path is None:
        import logging
        import sys

        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE:  # offline, the call below fails at once (hub_error says why)
            print(f"fetching {label}'s config.json from the Hugging Face Hub (once; cached after)", file=sys.stderr)
        hub_logger = logging.getLogger("huggingface_hub")
        level = hub_logger.level
        hub_logger.setLevel(logging.ERROR)  # its retry notices: the error below says what happened
        try:
            path = Path(hf_hub_download(repo, "config.json", revision=revision))
        except Exception as exc:  # every failure of the Hub client becomes an answer (hub_error)
            raise hub_error(label, repo, revision, exc, hub_errors, known_ids or {}) from None
        finally:
            hub_logger.setLevel(level)
    from reportgen.model import load_config_file

    config = load_config_file(path)
    check_transformers_knows(config, label)
    commit = path.parent.name if _COMMIT.fullmatch(path.parent.name) else None
    return HubConfig(repo=repo, requested=revision, commit=commit, path=path, config=config)


def hub_error(label: str, repo: str, revision: str | None, exc: Exception, hub_errors, known_ids: dict) -> UserError:
    """What went wrong fetching ``config.json``, in words, with what to do."""
    from huggingface_hub import constants

    offline = constants.is_offline_mode() if hasattr(constants, "is_offline_mode") else constants.HF_HUB_OFFLINE
    if isinstance(exc, hub_errors.GatedRepoError):
        return UserError(f"model {label!r} is a gated repository: its config.json needs a token of an account "
                         "that accepted its licence",
                         hint=f"accept the terms on https://huggingface.co/{repo}, then `hf auth login` "
                              "(or set HF_TOKEN) and run this again")
    if isinstance(exc, hub_errors.RepositoryNotFoundError):
        return UserError(f"model {label!r}: no such repository on the Hugging Face Hub (or it is private)",
                         hint=_did_you_mean(repo, known_ids) + "a private repository needs `hf auth login` "
                              "(or HF_TOKEN)")
    if isinstance(exc, hub_errors.RevisionNotFoundError):
        return UserError(f"model {label!r}: the repository has no revision {revision!r}",
                         hint="give a branch, tag or commit of the repository, or leave @REVISION out for its "
                              "default branch")
    if isinstance(exc, hub_errors.LocalEntryNotFoundError) or isinstance(exc, hub_errors.OfflineModeIsEnabled):
        if offline:
            return UserError(f"model {label!r}: HF_HUB_OFFLINE is set and its config.json is not in the "
                             "Hugging Face cache",
                             hint="run once with network (unset HF_HUB_OFFLINE) to cache it, or pass a path to "
                                  "the model's config.json")
        return UserError(f"model {label!r}: the Hugging Face Hub could not be reached and its config.json is "
                         "not in the cache", hint="check the network (or HF_ENDPOINT), or pass a path to the "
                                                  "model's config.json")
    if isinstance(exc, hub_errors.EntryNotFoundError):
        return UserError(f"model {label!r}: the repository has no config.json (a GGUF, an adapter or a "
                         "dataset repository?)",
                         hint="name the base model's repository (an adapter's adapter_config.json names it as "
                              "base_model_name_or_path)")
    if isinstance(exc, hub_errors.HFValidationError):
        return UserError(f"model {label!r} is not a valid Hub id", hint="a Hub id is ORG/NAME, e.g. Qwen/Qwen3-14B")
    if isinstance(exc, (hub_errors.HfHubHTTPError, OSError)):
        return UserError(f"model {label!r}: fetching its config.json failed ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:200] if str(exc) else 'no message'})",
                         hint="try again, or pass a path to the model's config.json")
    return UserError(f"model {label!r}: fetching its config.json failed ({type(exc).__name__})",
                     hint="pass a path to the model's config.json")


def _did_you_mean(repo: str, known_ids: dict[str, str]) -> str:
    import difflib

    by_lower = {k.lower(): k for k in known_ids}
    close = difflib.get_close_matches(repo.lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    return "did you mean " + " or ".join(f"{by_lower[c]!r} (catalog: {known_ids[by_lower[c]]})" for c in close) + "? "


def check_transformers_knows(config: dict, label: str) -> None:
    """A ``model_type`` transformers does not know needs the repository's own modeling code, which
    reportgen never runs (no ``trust_remote_code``): refused with what the config declares."""
    model_type = config.get("model_type")
    if config.get("auto_map"):
        try:
            from transformers import CONFIG_MAPPING
        except ImportError:
            return
        if model_type not in CONFIG_MAPPING:
            raise UserError(f"model {label!r} declares model_type {model_type!r}, which needs the repository's "
                            "own code (auto_map); reportgen never runs code from a repository, so neither the "
                            "estimate nor `reportgen trace` can model it",
                            hint="if a later transformers knows this model_type, upgrade it; else pass a "
                                 "config.json of a supported family (reportgen models)")
