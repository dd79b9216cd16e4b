"""The build pipeline and its stages: plugin registry and component selection, bundled model
fetch, resource checks, the pipeline (export → quantize → pack → compile), the compile stages
(emit IR → passes → link) and ``ditto cc``'s compiler driver."""
