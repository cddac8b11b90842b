"""The operator families dqtool ships, one folder each: ``qdq_onnx``, ``qdq_microsoft``,
``qdq_opmx``, ``fused``, ``integer``. Each folder's ``__init__`` defines ``FAMILY`` (a
``dqtool.registry.Family``); ``dqtool.registry`` lists them and answers every question
about them, so nothing here is imported but through it."""
