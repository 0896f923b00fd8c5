"""Campaigns (docs/campaigns.md): the campaign file (`model`, `loader`), cells and trials (`cells`, `schedule`),
verdicts (`verdicts`, over analysis/stats), one night run and resumed (`executor`), the commands (`commands`)."""
