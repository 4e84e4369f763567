"""The report: tables and plots turned into one self-contained HTML page.

- :mod:`~attnbench.report.build`: reads a results folder and builds the report.
- :mod:`~attnbench.report.summary`: the cards at the top, one per question.
- :mod:`~attnbench.report.verdicts`: the scaling section, its verdicts as
  :mod:`attnbench.studies.scaling` decided them, more plots.
- :mod:`~attnbench.report.html`: writes the HTML page; :mod:`~attnbench.report.tables`
  its tables (formatted numbers, verdict colours).
- :mod:`~attnbench.report.plots`: the figures; :mod:`~attnbench.report.heatmaps` the
  attention heat maps.
- :mod:`attnbench.section` (below every layer that makes sections): the unit a report
  is made of, and the verdict tones.
- :mod:`~attnbench.report.hosts`: results of several machines side by side.
- :mod:`~attnbench.report.variants`: the backward's plots, the variants section.
"""
