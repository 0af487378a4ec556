"""Training: models, metrics, optimisers, the LightningModules, plain loops, the one Trainer wiring, the speedrun
recipe and its experiments. Imports base, measure and data."""
