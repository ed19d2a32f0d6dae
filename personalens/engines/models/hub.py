"""Models named by a Hugging Face hub id (`meta-llama/Llama-3.1-8B-Instruct`), found in the local
Hugging Face cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) by
huggingface_hub itself, at a branch, tag or commit. Nothing is downloaded unless the model config
allows it (`download: true`); a model missing from the cache is refused with the `hf download`
command that puts it there, which on a cluster runs on a login node (compute nodes then set
`HF_HUB_OFFLINE=1`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from personalens.errors import PersonalensError

# what a model directory needs: config, tokenizer and chat template files, safetensors weights (also
# the files a download fetches, and those a snapshot is checked against when its file list is cached)
WEIGHT_FILES = ("*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "*.txt")
TOKENIZER_FILES = ("*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "*.txt")


class HubModelError(PersonalensError):
    """A hub id that is not in the local cache (or is no valid id)."""


@dataclass(frozen=True)
class HubSnapshot:
    """Where a hub id was found: the snapshot folder every engine, planner and tokenizer reads."""

    repo_id: str
    revision: str  # as asked: a branch, tag or commit
    commit: str  # the snapshot's commit hash: which weights exactly
    directory: Path

    def label(self) -> str:
        return f"{self.repo_id} at {self.commit[:12]}"

    def as_dict(self) -> dict:
        return {"id": self.repo_id, "revision": self.revision, "commit": self.commit, "directory": str(self.directory)}


def is_valid_id(text: str) -> bool:
    """Whether `text` is shaped as a hub id (`name` or `org/name`; huggingface_hub's own rule)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def cache_dir() -> Path:
    """The cache huggingface_hub searches (read from the environment when it was imported)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def download_command(repo_id: str, revision: str | None, cache: Path) -> str:
    pinned = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{pinned} --cache-dir {cache}"


def find_snapshot(
    repo_id: str, revision: str | None, *, download: bool, patterns: tuple[str, ...], where: str
) -> HubSnapshot:
    """The cached snapshot of `repo_id` at `revision` (None: main); fetched first only with
    `download`. `where` names the config key in errors (`model@assistant.path`)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir()
    asked = revision or "main"
    try:
        folder = snapshot_download(
            repo_id,
            revision=asked,
            cache_dir=cache,
            local_files_only=not download,
            allow_patterns=list(patterns),
        )
    except LocalEntryNotFoundError as err:
        # also an incomplete snapshot (IncompleteSnapshotError is one): the same command completes it
        allow = f"; or set {where.rsplit('.', 1)[0].removeprefix('model@')}.download=true to let personalens fetch it"
        raise HubModelError(
            f"{where}: {repo_id} (revision {asked}) is neither a local directory nor in the Hugging Face cache "
            f"{cache} ({_reason(err)}); download it there first, e.g. on a login node: "
            f"`{download_command(repo_id, revision, cache)}`" + ("" if download else allow)
        ) from None
    except OSError as err:  # a download that was allowed and failed (network, authentication, gated model)
        raise HubModelError(f"{where}: could not download {repo_id} (revision {asked}) into {cache}: {err}") from None
    directory = Path(folder)
    return HubSnapshot(repo_id, asked, directory.name, directory)


def _reason(err: Exception) -> str:
    if hasattr(err, "snapshot_path"):  # huggingface_hub's IncompleteSnapshotError: its file list says what is missing
        return str(err).split(". ")[0]
    return "not found"
