
import sys
sys.path.insert(0, '/root/.cache/tandem/probe/py3.12.1-08d7b3be510c374f')
try:
    import engine.probe
    engine.probe.start_session('/work/wt/i15/AS')
except BaseException as err:
    from engine.probe.start_hook import note_unprobed
    note_unprobed('/work/wt/i15/AS', "attach: %s" % err, say=False)
finally:
    sys.path.remove('/root/.cache/tandem/probe/py3.12.1-08d7b3be510c374f')
