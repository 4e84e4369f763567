"""The report: tables and plots turned into one self-contained HTML page.

- :mod:`~attnbench.report.build`: reads a results folder and builds the report.
- :mod:`~attnbench.report.html`: writes the HTML page.
- :mod:`~attnbench.report.plots`: the figures.
- :mod:`~attnbench.report.sections`: the unit a report is made of.
- :mod:`~attnbench.report.hosts`: results of several machines side by side.
"""
