"""`python -m course_lib fit|validate|test|predict`: LightningCLI over the course's module and data, sized by COURSE_SIZE."""
from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from . import config, parallel
from .data import CIFAR10DataModule
from .modules import ImageClassifierModule


class CourseCLI(LightningCLI):
    """LightningCLI whose defaults follow the run-size switch and the data source; flags and configs override them."""

    def add_arguments_to_parser(self, parser) -> None:
        size = config.run_size()
        parser.set_defaults({
            "data.image_folder": config.data_source(),
            "data.subset": size.train_subset,
            "data.eval_subset": size.eval_subset,
            "trainer.max_epochs": size.epochs,
        })

    def before_instantiate_classes(self) -> None:
        """Asking for more GPUs than this machine has fails here, with the remedy named (see parallel.check_devices)."""
        trainer = (self.config[self.subcommand] if self.subcommand else self.config).trainer
        parallel.check_devices(trainer.accelerator, trainer.devices)


def main(args: list[str] | None = None) -> CourseCLI:
    """Entry point; `args` lets tests call it in-process."""
    return CourseCLI(ImageClassifierModule, CIFAR10DataModule, seed_everything_default=0, args=args,
                     save_config_kwargs={"overwrite": True})
