# deb_fixup.cmake — run by cpack after it has made the Debian packages (CPACK_POST_BUILD_SCRIPTS,
# set in deploy/cpack.cmake): two things of a package's control archive that CPack's DEB generator
# gets wrong and that dpkg-gencontrol and dh_makeshlibs get right.
#   Installed-Size  CPack counts a symbolic link as the file it points to (libattnstat0's soname
#                   link doubled the library's size); here as dpkg-gencontrol counts: each regular
#                   file once in KiB rounded up, each link, directory or other object as 1 KiB.
#   ldconfig        CPack adds postinst and postrm scripts that run ldconfig to a package holding
#                   a shared library under /usr/lib; a Debian library package activates the
#                   ldconfig trigger instead (its triggers file, from deploy/deb/lib.triggers).
#                   Such scripts, when they do nothing else, are removed from a package that has
#                   the trigger.
# Only the control archive is rewritten (owner root, sorted, the members' order kept): the data
# archive, and with it md5sums, is left as cpack made it. Given by cpack: CPACK_PACKAGE_FILES (the
# packages made), CPACK_ATTNSTAT_AR (the build's archiver).
if(NOT CPACK_ATTNSTAT_AR)
  set(CPACK_ATTNSTAT_AR ar)
endif()

function(fixup_run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  ${FIXUP_RUN_OPTS})
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "deb_fixup: ${what} failed (${rc}): ${ARGN}\n${out}${err}")
  endif()
  set(fixup_out "${out}" PARENT_SCOPE)
endfunction()

# The Installed-Size of a data archive, in KiB, as dpkg-gencontrol computes it.
function(fixup_installed_size tarball out_var)
  fixup_run("listing ${tarball}" tar -tvf ${tarball} --numeric-owner)
  string(REPLACE "\n" ";" lines "${fixup_out}")
  set(kib 1) # the package's root directory
  foreach(line IN LISTS lines)
    if(line MATCHES "^-[^ ]+ +[^ ]+ +([0-9]+) ")
      math(EXPR kib "${kib} + (${CMAKE_MATCH_1} + 1023) / 1024")
    elseif(line MATCHES "^[a-z]")
      math(EXPR kib "${kib} + 1")
    endif()
  endforeach()
  set(${out_var} ${kib} PARENT_SCOPE)
endfunction()

# Whether a maintainer script only runs ldconfig (CPack's: a shebang, set -e, an if on "configure"
# around ldconfig).
function(fixup_only_ldconfig script out_var)
  file(STRINGS ${script} lines)
  set(only FALSE)
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    if(line STREQUAL "ldconfig")
      set(only TRUE)
    elseif(NOT (line STREQUAL "" OR line MATCHES "^#!/bin/sh$" OR line STREQUAL "set -e"
                OR line MATCHES "^if \\[ \"\\$1\" = \"(configure|remove)\" \\]; then$"
                OR line STREQUAL "fi"))
      set(${out_var} FALSE PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out_var} ${only} PARENT_SCOPE)
endfunction()

foreach(deb IN LISTS CPACK_PACKAGE_FILES)
  if(NOT deb MATCHES "\\.deb$")
    continue()
  endif()
  get_filename_component(name ${deb} NAME)
  set(work ${deb}.fixup)
  file(REMOVE_RECURSE ${work})
  file(MAKE_DIRECTORY ${work}/ar ${work}/control)
  set(FIXUP_RUN_OPTS WORKING_DIRECTORY ${work}/ar)
  fixup_run("ar x ${name}" ${CPACK_ATTNSTAT_AR} x ${deb})
  fixup_run("ar t ${name}" ${CPACK_ATTNSTAT_AR} t ${deb})
  string(REGEX REPLACE "/?\n$" "" members "${fixup_out}")
  string(REGEX REPLACE "/?\n" ";" members "${members}")
  list(GET members 1 control_tar)
  list(GET members 2 data_tar)
  if(NOT control_tar MATCHES "^control\\.tar" OR NOT data_tar MATCHES "^data\\.tar")
    message(FATAL_ERROR "deb_fixup: ${name}: members '${members}' are not a Debian package's")
  endif()
  set(FIXUP_RUN_OPTS WORKING_DIRECTORY ${work}/control)
  fixup_run("extracting ${name}'s ${control_tar}" tar -xf ../ar/${control_tar})

  file(READ ${work}/control/control control)
  fixup_installed_size(${work}/ar/${data_tar} size)
  string(REGEX REPLACE "\nInstalled-Size: [0-9]+\n" "\nInstalled-Size: ${size}\n" fixed
         "${control}")
  set(changed FALSE)
  if(NOT fixed STREQUAL control)
    file(WRITE ${work}/control/control "${fixed}")
    set(changed TRUE)
  endif()
  if(EXISTS ${work}/control/triggers)
    file(STRINGS ${work}/control/triggers triggers REGEX "^activate-noawait ldconfig$")
    foreach(script postinst postrm)
      if(triggers AND EXISTS ${work}/control/${script})
        fixup_only_ldconfig(${work}/control/${script} only)
        if(only)
          file(REMOVE ${work}/control/${script})
          set(changed TRUE)
        endif()
      endif()
    endforeach()
  endif()

  if(changed)
    set(mtime)
    if(DEFINED ENV{SOURCE_DATE_EPOCH})
      set(mtime --clamp-mtime --mtime=@$ENV{SOURCE_DATE_EPOCH})
    endif()
    fixup_run("packing ${name}'s control archive" tar --format=gnu --sort=name --owner=0 --group=0
              --numeric-owner ${mtime} --auto-compress -cf ../ar/${control_tar} .)
    set(FIXUP_RUN_OPTS WORKING_DIRECTORY ${work}/ar)
    file(REMOVE ${deb})
    fixup_run("ar rcSD ${name}" ${CPACK_ATTNSTAT_AR} rcSD ${deb} ${members})
    message(STATUS "deb_fixup: ${name}: Installed-Size ${size} KiB")
  endif()
  file(REMOVE_RECURSE ${work})
endforeach()
