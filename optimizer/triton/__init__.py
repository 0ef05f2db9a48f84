"""The Triton side, a room per job:

    config/       config.pbtxt: rendered from the platform's template, parsed into Triton's schema, checked against
                  Triton's load-time rules (rules/), and the client contract's ensemble in front of a positional model
    runtime/      running Triton's own tools: the local tritonserver, perf_analyzer and its input data, a user's
                  server (--url), and the stand-in backends the bundled server runs
    repository/   publishing: atomic placement in a folder or object storage (s3://), the Model Analyzer config
                  beside the report, reading a published export back
    measure/      measuring in a server: the served search, `validate`, and what both share (the client calls, the
                  answer check, which model a repository serves, the prediction)

Dependencies point down: measure -> repository -> runtime -> config.
"""
