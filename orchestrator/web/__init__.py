"""`tcplab serve`: a read-only web page over the result database (docs/web.md).

db.py opens the database read-only; queries.py builds the bounded queries and reads rows (filters are pure
values); figures.py turns analysed runs and nightly medians into plotly figure specs (pure); app.py is the
Starlette app (routes, templates, plotly.js served from the plotly package); commands.py the subcommand.
"""
