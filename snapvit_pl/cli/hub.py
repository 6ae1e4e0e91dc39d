"""``snapvit-pl hub`` / ``python -m snapvit_pl.hub``: publish a pruned checkpoint on the Hugging Face Hub with a
generated model card (``push``), or print that card (``card``, no network)."""
from __future__ import annotations

from typing import Optional

from .common import command_parser, run_command

EPILOG = """examples:
  snapvit-pl hub card --checkpoint runs/prune/X/models/sparsity0.5 --repo org/vit-s-dino-pruned-50
  snapvit-pl hub push --checkpoint runs/prune/X/models/sparsity0.5 --repo org/vit-s-dino-pruned-50 --private true"""
_SECTIONS = ("checkpoint", "repo", "private", "token", "timeout", "verbose")


def build_parser():
    """The ``hub`` command's parser (subcommands ``push`` and ``card``)."""
    from jsonargparse import ArgumentParser

    from ..models.loading import HTTP_TIMEOUT
    from ..ranges import PositiveFloat

    parser = command_parser("snapvit-pl hub", __doc__, _SECTIONS, EPILOG)
    commands = parser.add_subcommands(dest="command")
    for name, help_text in (("push", "upload a pruned checkpoint with a generated model card"),
                            ("card", "print the model card push would upload (no network)")):
        sub = ArgumentParser(exit_on_error=False)
        sub.add_argument("--checkpoint", type=str, required=True,
                         help="pruned checkpoint directory (prune.py's models/<budget>)")
        sub.add_argument("--repo", type=str, required=True, help="org/name on the Hugging Face Hub")
        if name == "push":
            sub.add_argument("--private", type=bool, default=False, help="create the repository private")
            sub.add_argument("--token", type=Optional[str], default=None, help="a Hub token (default: the logged-in one)")
            sub.add_argument("--timeout", type=PositiveFloat, default=HTTP_TIMEOUT,
                             help="seconds each connection, read or write may wait for the Hub")
        commands.add_subcommand(name, sub, help=help_text)
    return parser


def check_repo_id(repo: str) -> None:
    """Refuse what the Hub would not take as a model repository id (huggingface_hub's own rule, plus org/name)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from ..errors import ConfigError

    try:
        validate_repo_id(repo)
    except HFValidationError as err:
        raise ConfigError(f"--repo {repo!r} is not a Hub repository id ({str(err).split(':')[0]}); give org/name") \
            from None
    if repo.count("/") != 1:
        raise ConfigError(f"--repo {repo!r} must be org/name (your user name or an organisation, then the model)")


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    return run_command(_hub, argv, "snapvit-pl hub")


def _hub(argv: list[str]) -> int:
    from ..errors import ConfigError, SnapViTError
    from ..models.checkpoint import verify_checkpoint
    from ..models.publish import model_card, push_to_hub

    args = build_parser().parse_args(argv)
    command = args.command
    options = args[command]
    check_repo_id(options.repo)
    if command == "card":
        print(model_card(verify_checkpoint(options.checkpoint), options.repo))
        return 0
    try:
        url = push_to_hub(options.checkpoint, options.repo, private=options.private, token=options.token,
                          timeout=options.timeout)
    except SnapViTError:
        raise
    except Exception as err:  # network, authentication, permissions
        waited = "Timeout" in type(err).__name__ or "timed out" in str(err)
        fix = (f"the Hub did not answer within --timeout {options.timeout:g} s: check your network (HF_ENDPOINT), or "
               "raise --timeout" if waited else "check your network and `huggingface-cli login`")
        raise ConfigError(f"the upload to {options.repo} failed ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}); {fix}") from err
    print(f"pushed {options.checkpoint} to {url}")
    return 0
