"""`python -m lab`: the lab's command line (lab/cli.py), as the `payouts-lab` console script."""

from lab.cli import run

if __name__ == "__main__":
    run()
