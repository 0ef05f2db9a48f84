"""What a run reports: report.json (machine-readable), and later Markdown and plots."""
