"""The project.yml workflows' scripts. Run from the repository root as modules
(`python -m scripts.runs ...`), so that they import each other as a package."""
