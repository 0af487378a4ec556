"""The benchmark harness (timed fits, tables) and a step's time breakdown. Imports the layers below (base, measure,
data, training)."""
