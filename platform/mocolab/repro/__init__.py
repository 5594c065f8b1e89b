"""The reproduction: the studies that make the project's evidence, run or resumed by one command, exported to
CSV files and written up as ``docs/REPRODUCTION.md`` from those files alone (``mocolab repro``)."""
