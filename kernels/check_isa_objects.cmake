# Fails when an ISA-specific object file defines a weak (W/V) or unique (u) global symbol:
# such code (inline functions, template instances, static locals' guards) may be picked by the
# linker for callers compiled for the baseline ISA. Run by CTest with -DOBJECTS=<a;b;...>.
foreach(obj IN LISTS OBJECTS)
  execute_process(COMMAND nm --defined-only ${obj} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "nm failed on ${obj}")
  endif()
  string(REGEX MATCHALL "[0-9a-f]+ [WVu] [^\n]+" bad "${syms}")
  if(bad)
    message(FATAL_ERROR "${obj} defines shared inline code:\n${bad}")
  endif()
  message(STATUS "${obj}: no weak or unique symbols")
endforeach()
