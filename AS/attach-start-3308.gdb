set pagination off
set confirm off
set unwindonsignal on
set breakpoint pending off
break malloc
break free
break calloc
break realloc
break PyMem_Malloc
break PyMem_Free
break PyObject_Malloc
break PyObject_Free
commands 1-8
  disable breakpoints
  set $handle = (void *) dlopen("/root/.cache/tandem/inject/tandem_inject-a3c211f165b43354.so", 2)
  set $run = (int (*)(const char *)) dlsym($handle, "tandem_inject_run")
  printf "tandem-inject: %d\n", $run ? $run("\"/work/wt/i15/AS/attach-start-3308.py\"") : -2
  detach
  quit
end
continue
