"""Traces to and from other tools: ``trainio export --fio`` (:mod:`~trainio_analysis.interop.export_fio`),
``trainio import`` of dftracer and blktrace traces (:mod:`~trainio_analysis.interop.import_trace`),
and what both share (:mod:`~trainio_analysis.interop.common`)."""
