"""The arguments of every command: one dataclass each, one source for each setting.

Every field is declared with ``arg(default, help)``, so its default and its help text are written
once, here. The CLI builds its options from these fields (cli/common.py: flags are the field names
in kebab case unless ``flags`` says otherwise) and the Python API takes the dataclasses:

    from mlmkit.args import PretrainArgs, TrainArgs
    from mlmkit.train.pretrain import pretrain
    pretrain(PretrainArgs(corpus=["corpus.txt"], out="runs/a", train=TrainArgs(steps=200)))

``TrainArgs`` (the training loop's settings) is composed into ``PretrainArgs`` and ``FinetuneArgs``
as their ``train`` field, whose factory holds that command's defaults. ``Args.from_flat`` builds
any of them from flat names (``PretrainArgs.from_flat(corpus=[...], out=..., steps=200)``), as the
CLI does. Cross-field rules live in ``__post_init__`` and name the CLI flags. No torch here.

An option name means one thing in every command that has it, and is declared once, as an ``Opt`` of a
group (``Engine``: --engine, --address; ``Runtime``: --device, --precision, --min-agreement, --threads,
--batch-size, --batch-tokens, --window, --workers; ``Output``: --output, --json, --out, --resume;
``Inputs``: --input, --text-column, --id-column, --corpus ...; ``Training``; ``Embedding`` and
``Search`` beside the retrieval commands, inference.py), and each dataclass takes it as a field:
``device: str = Runtime.device()``. An option whose default is each command's own is declared
``per_command``, its help saying what it is in each (``out: Path = Output.out(Path("curves.png"))``);
a task option's flag of the same name shows that help. ``BuildArgs`` (`mlmkit index`) lives with the
index it builds, mlmkit.retrieval.index.building.
"""

from __future__ import annotations

from mlmkit.args.base import (
    MIN_AGREEMENT_HELP,
    PRECISION_HELP,
    PRECISIONS,
    A,
    Args,
    Chunks,
    CliField,
    Engine,
    Fusion,
    Inputs,
    Opt,
    Output,
    Runtime,
    Training,
    arg,
    check_precision,
    check_weights,
    cli_fields,
    declared,
    flag,
    fusion_weights,
    per_command_flags,
)
from mlmkit.args.distill import (
    DISTILL_AUGMENT_BELOW,
    DISTILL_HIDDEN,
    DISTILL_LR,
    DISTILL_RELATIONS,
    DistillArgs,
)
from mlmkit.args.inference import (
    DataArgs,
    EmbedArgs,
    Embedding,
    InferenceArgs,
    MineArgs,
    QaArgs,
    QuickstartArgs,
    RerankArgs,
    Search,
    SearchArgs,
)
from mlmkit.args.serve import ServeArgs
from mlmkit.args.training import (
    CORPUS_HELP,
    EvaluateArgs,
    ExportArgs,
    FinetuneArgs,
    PlotArgs,
    PretrainArgs,
    SweepArgs,
    TokenizeArgs,
    TokenizerArgs,
    TrainArgs,
)

__all__ = [
    "A",
    "PRECISIONS",
    "PRECISION_HELP",
    "MIN_AGREEMENT_HELP",
    "check_precision",
    "arg",
    "CliField",
    "cli_fields",
    "flag",
    "declared",
    "per_command_flags",
    "Args",
    "Opt",
    "Engine",
    "Chunks",
    "Embedding",
    "Search",
    "Fusion",
    "fusion_weights",
    "check_weights",
    "Runtime",
    "Output",
    "Inputs",
    "Training",
    "TrainArgs",
    "CORPUS_HELP",
    "TokenizerArgs",
    "TokenizeArgs",
    "PretrainArgs",
    "FinetuneArgs",
    "DISTILL_AUGMENT_BELOW",
    "DISTILL_HIDDEN",
    "DISTILL_LR",
    "DISTILL_RELATIONS",
    "DistillArgs",
    "SweepArgs",
    "EvaluateArgs",
    "PlotArgs",
    "ExportArgs",
    "InferenceArgs",
    "EmbedArgs",
    "QaArgs",
    "RerankArgs",
    "SearchArgs",
    "MineArgs",
    "DataArgs",
    "QuickstartArgs",
    "ServeArgs",
]
