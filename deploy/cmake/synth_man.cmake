# synth_man.cmake — writes attnstat-synth(1) from the program's own --help and --version, so that
# the page cannot drift from them (the other pages come from the option tables: deploy/docgen.c).
# Run at build time (deploy/CMakeLists.txt): cmake -DSYNTH=PROGRAM -DOUT=FILE -P synth_man.cmake.
# The usage lines are the synopsis, the rest the description; $SOURCE_DATE_EPOCH, when set, dates
# the page, as docgen dates the others.
foreach(v SYNTH OUT)
  if(NOT ${v})
    message(FATAL_ERROR "synth_man.cmake: -D${v}= is missing")
  endif()
endforeach()
foreach(arg --help --version)
  execute_process(COMMAND ${SYNTH} ${arg} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR out STREQUAL "")
    message(FATAL_ERROR "synth_man.cmake: ${SYNTH} ${arg} exited ${rc}: ${err}")
  endif()
  set(text${arg} "${out}")
endforeach()
if(NOT text--version MATCHES "^attnstat-synth ([^ \n]+)")
  message(FATAL_ERROR "synth_man.cmake: '${text--version}' is not attnstat-synth's --version")
endif()
set(version ${CMAKE_MATCH_1})

# roff: backslashes and hyphens escaped; a line starting with a control character made plain.
function(roff in out_var)
  string(REPLACE "\\" "\\e" in "${in}")
  string(REPLACE "-" "\\-" in "${in}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" in "${in}")
  set(${out_var} "${in}" PARENT_SCOPE)
endfunction()

# The usage: from "usage: " to the first empty line; the description: the rest.
string(FIND "${text--help}" "\n\n" cut)
if(cut LESS 0 OR NOT text--help MATCHES "^usage: ")
  message(FATAL_ERROR "synth_man.cmake: ${SYNTH} --help has no 'usage:' paragraph")
endif()
string(SUBSTRING "${text--help}" 0 ${cut} usage)
math(EXPR rest "${cut} + 2")
string(SUBSTRING "${text--help}" ${rest} -1 description)
string(REGEX REPLACE "^usage: " "" usage "${usage}")
string(REGEX REPLACE "\n                      " "\n       " usage "${usage}")
string(STRIP "${description}" description)
roff("${usage}" usage)
roff("${description}" description)

set(date "")
if(DEFINED ENV{SOURCE_DATE_EPOCH})
  string(TIMESTAMP date "%Y-%m-%d" UTC)
endif()
file(WRITE ${OUT}
".TH ATTNSTAT\\-SYNTH 1 \"${date}\" \"attnstat ${version}\" \"User Commands\"
.SH NAME
attnstat\\-synth \\- a synthetic training process that pushes attention tensors to attnstatd
.SH SYNOPSIS
.nf
${usage}
.fi
.SH DESCRIPTION
${description}
.SH SEE ALSO
.BR attnstatd (8),
.BR attnstat (1)
")
