"""Campaigns (docs/campaigns.md): the file, cells, the nightly executor, verdicts, `tcplab campaign`."""
