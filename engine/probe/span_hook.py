"""In a session's interpreters: every OpenTelemetry SDK TracerProvider puts thread.id on its spans.

`tandem record` (and `tandem live --otlp-receiver`) receive the spans of the services they
start (docs/spans.md); the Python SDK does not say which thread a span ran on, so a service
left unchanged would give spans tandem cannot put on a thread. With TANDEM_SPANS set in its
environment, the start hook (autostart.run) calls `install()`: a finder on sys.meta_path that
answers no import itself and waits for the SDK's `opentelemetry.sdk.trace`; once that module
has loaded, `TracerProvider.__init__` also adds engine.probe.spans.ThreadOfSpan to the new
provider. A service without the SDK pays one string comparison per first import of a module;
nothing of OpenTelemetry is imported by tandem.

Standard library only; runs at interpreter start.
"""
import sys

SDK_TRACE = "opentelemetry.sdk.trace"
ENVIRONMENT = "TANDEM_SPANS"  # set (to 1) by tandem for the commands whose spans it receives


class _WhenTheSdkLoads:
    def find_spec(self, name, path=None, target=None):
        if name != SDK_TRACE:
            return None
        sys.meta_path.remove(self)  # once: the other finders find the module
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module  # (the loader is this module's own)
        return spec


def patch(module) -> None:
    """Every TracerProvider of MODULE (the SDK's opentelemetry.sdk.trace) made from now on adds ThreadOfSpan."""
    provider_class = getattr(module, "TracerProvider", None)
    if provider_class is None or getattr(provider_class, "_tandem_patched", False):
        return
    init = provider_class.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            from engine.probe.spans import add_thread_of_span

            add_thread_of_span(self)
        except Exception as err:  # never break the service: its spans just carry no thread
            sys.stderr.write("tandem: thread.id not added to the OpenTelemetry spans (%s: %s)\n" % (type(err).__name__, err))

    provider_class.__init__ = __init__
    provider_class._tandem_patched = True


def install() -> None:
    """Patch the SDK now if it is loaded already, else when it loads."""
    if SDK_TRACE in sys.modules:
        patch(sys.modules[SDK_TRACE])
    elif not any(isinstance(finder, _WhenTheSdkLoads) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenTheSdkLoads())
