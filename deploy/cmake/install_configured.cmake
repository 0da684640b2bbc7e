# install_configured.cmake — run at install time (install(CODE) in deploy/CMakeLists.txt): writes
# the files that name the install's own directories, for the prefix being installed to
# (CMAKE_INSTALL_PREFIX at install time; DESTDIR, when set, is prepended by file(INSTALL)).
#   tools: the systemd unit (ExecStart=, --config, the example drop-in's path) and the example
#          config, which goes to /etc for the prefix /usr (the Debian packages) and to PREFIX/etc
#          otherwise; a config file that is already there is kept (the administrator's; dpkg
#          handles it as a conffile).
#   dev:   attnstat.pc.
# Given by the caller: ATTNSTAT_COMPONENT, ATTNSTAT_DEPLOY_DIR, ATTNSTAT_GENERATED, ATTNSTAT_VERSION,
# ATTNSTAT_BINDIR, ATTNSTAT_LIBDIR, ATTNSTAT_INCLUDEDIR, ATTNSTAT_UNITDIR, ATTNSTAT_DOCDIR (relative
# to the prefix).
set(prefix "${CMAKE_INSTALL_PREFIX}")
if(prefix STREQUAL "/usr")
  set(sysconfdir "/etc")
else()
  set(sysconfdir "${prefix}/etc")
endif()
# A directory of its own, so that two installs at once (cpack and cmake --install) do not meet.
string(RANDOM LENGTH 12 tag)
set(stage "${ATTNSTAT_GENERATED}/install-${tag}")
file(MAKE_DIRECTORY "${stage}")

if(ATTNSTAT_COMPONENT STREQUAL "tools")
  set(BINDIR "${prefix}/${ATTNSTAT_BINDIR}")
  set(SYSCONFDIR "${sysconfdir}")
  set(DOCDIR "${prefix}/${ATTNSTAT_DOCDIR}")
  configure_file("${ATTNSTAT_DEPLOY_DIR}/attnstatd.service.in" "${stage}/attnstatd.service" @ONLY)
  file(INSTALL "${stage}/attnstatd.service" DESTINATION "${prefix}/${ATTNSTAT_UNITDIR}"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  if(EXISTS "$ENV{DESTDIR}${sysconfdir}/attnstat/attnstatd.conf")
    message(STATUS "Keeping: $ENV{DESTDIR}${sysconfdir}/attnstat/attnstatd.conf (the new example "
                   "is ${ATTNSTAT_GENERATED}/attnstatd.conf)")
  else()
    file(INSTALL "${ATTNSTAT_GENERATED}/attnstatd.conf" DESTINATION "${sysconfdir}/attnstat"
         FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  endif()
elseif(ATTNSTAT_COMPONENT STREQUAL "dev")
  set(PREFIX "${prefix}")
  set(LIBDIR "${ATTNSTAT_LIBDIR}")
  set(INCLUDEDIR "${ATTNSTAT_INCLUDEDIR}")
  set(VERSION "${ATTNSTAT_VERSION}")
  configure_file("${ATTNSTAT_DEPLOY_DIR}/cmake/attnstat.pc.in" "${stage}/attnstat.pc" @ONLY)
  file(INSTALL "${stage}/attnstat.pc" DESTINATION "${prefix}/${ATTNSTAT_LIBDIR}/pkgconfig"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
file(REMOVE_RECURSE "${stage}")
