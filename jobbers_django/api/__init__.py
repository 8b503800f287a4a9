"""The REST API (docs/howto/rest-api.md), mounted with
``path("jobbers/", include("jobbers_django.urls"))``: one module per resource.

- :mod:`~jobbers_django.api.base`: errors naming their field, strict query parameters, the
  schema decorator and :class:`~jobbers_django.api.base.JobbersAPIView`;
- :mod:`~jobbers_django.api.serializers`: what the endpoints read and answer;
- :mod:`~jobbers_django.api.parsers`: JSON bodies, a body nested too deep a 400;
- :mod:`~jobbers_django.api.deadletters`: search, history, resubmit, discard;
- :mod:`~jobbers_django.api.runs`: paced resubmits;
- :mod:`~jobbers_django.api.tasks`: live tasks (scheduled, a task's detail, cancel);
- :mod:`~jobbers_django.api.schema`: the OpenAPI schema of these endpoints.
"""
