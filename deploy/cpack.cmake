# cpack.cmake — the Debian packages (included by deploy/CMakeLists.txt; the components and the
# reason for CPack are there).
#
#   cmake --build build --target package      ->  build/packages/*.deb
#   sudo apt install ./build/packages/*.deb   (or dpkg -i: apt also fetches the dependencies)
#
# The packages install under /usr (/etc for the config) whatever prefix the build was configured
# with: files naming their own directories are written at install time (cmake/
# install_configured.cmake), which cpack runs with the prefix /usr and DESTDIR set. Configure
# with -DCMAKE_INSTALL_PREFIX=/usr to get the multiarch library directory
# (/usr/lib/x86_64-linux-gnu) as well; otherwise the library goes to /usr/lib.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME attnstat)
set(CPACK_PACKAGE_VENDOR attnstat)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL tools lib dev python)

# The Maintainer (and the signature of the changelog's entry). Debian's tools (dch, debmake) take
# the packager from $DEBFULLNAME and $DEBEMAIL: so does the first configure. Without them, a
# placeholder in a domain reserved for examples (RFC 2606: no mail reaches anybody), which is to be
# replaced before the packages leave the site: -DATTNSTAT_DEB_MAINTAINER="Name <address>".
if(NOT "$ENV{DEBEMAIL}" STREQUAL "")
  if("$ENV{DEBEMAIL}" MATCHES "<")
    set(deb_maintainer "$ENV{DEBEMAIL}")
  elseif(NOT "$ENV{DEBFULLNAME}" STREQUAL "")
    set(deb_maintainer "$ENV{DEBFULLNAME} <$ENV{DEBEMAIL}>")
  else()
    set(deb_maintainer "attnstat maintainers <$ENV{DEBEMAIL}>")
  endif()
else()
  set(deb_maintainer "attnstat maintainers <maintainers@attnstat.example.org>")
endif()
set(ATTNSTAT_DEB_MAINTAINER "${deb_maintainer}" CACHE STRING
    "Maintainer of the Debian packages: 'Name <address>' (default: $DEBFULLNAME <$DEBEMAIL>)")
if(NOT ATTNSTAT_DEB_MAINTAINER MATCHES "^[^<>@]*[^ <>@] <[^ <>@]+@[^ <>@]+\\.[^ <>@]+>$"
   OR ATTNSTAT_DEB_MAINTAINER MATCHES "@localhost(\\.localdomain)?>$")
  message(FATAL_ERROR "ATTNSTAT_DEB_MAINTAINER '${ATTNSTAT_DEB_MAINTAINER}' is not "
                      "'Name <address>' with an address mail can reach (Debian policy 5.6.2): "
                      "set it with -DATTNSTAT_DEB_MAINTAINER='Your Name <you@your.domain>'")
endif()
message(STATUS "attnstat: the Debian packages' Maintainer: ${ATTNSTAT_DEB_MAINTAINER} "
               "(-DATTNSTAT_DEB_MAINTAINER or $DEBFULLNAME/$DEBEMAIL to change it)")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${ATTNSTAT_DEB_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
# One source package, attnstat, as for a debian/ directory: its changelog is every package's.
set(CPACK_DEBIAN_PACKAGE_SOURCE attnstat)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
# Descriptions: the first line is the synopsis, the others the long description.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
set(deb_extra ${CMAKE_CURRENT_BINARY_DIR}/deb)

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME attnstat)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION misc)
# procps: /bin/kill of the unit's ExecReload=.
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "procps")
set(CPACK_DEBIAN_TOOLS_PACKAGE_RECOMMENDS "systemd | systemd-standalone-sysusers")
set(CPACK_DEBIAN_TOOLS_PACKAGE_SUGGESTS "python3-attnstat, libattnstat-dev")
set(CPACK_DEBIAN_TOOLS_DESCRIPTION
"attention entropy and max-logit monitoring daemon, and its CLI
attnstatd receives the query and key tensors of training processes (host
tensors through shared memory, GPU tensors by CUDA IPC handle), computes
per-row attention entropy and max logit, keeps per-(layer, head) history in
SQLite and raises alerts (entropy collapse, logit growth, non-finite logits).
attnstat shows trends, heatmaps, alerts and the daemon's live status. Runs as
the systemd service attnstatd.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_EXTRA
    ${deb_extra}/tools/postinst ${deb_extra}/tools/prerm ${deb_extra}/tools/postrm
    ${deb_extra}/tools/conffiles)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libattnstat${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_DESCRIPTION
"client library of attnstatd (attention monitoring)
libattnstat hands a training job's attention tensors to attnstatd without
ever blocking the caller, and reconnects by itself when the daemon restarts.")
# The ldconfig trigger, not ldconfig in maintainer scripts (cmake/deb_fixup.cmake removes those that
# CPack adds).
set(CPACK_DEBIAN_LIB_PACKAGE_CONTROL_EXTRA ${deb_extra}/lib/triggers)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libattnstat-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libattnstat${PROJECT_VERSION_MAJOR} (= ${deb_version})")
set(CPACK_DEBIAN_DEV_DESCRIPTION
"client library of attnstatd (development files)
The header attnstat.h, pkg-config (attnstat.pc) and CMake
(find_package(attnstat), target attnstat::attnstat) files of libattnstat.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-attnstat)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3:any, libattnstat${PROJECT_VERSION_MAJOR} (>= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "python3-numpy")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
"client of attnstatd for Python (attention monitoring)
import attnstat: pushes PyTorch, NumPy or CuPy tensors to attnstatd (CUDA
tensors without a copy), and attnstat.torch monitors an unmodified PyTorch
model.")
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA ${deb_extra}/python/postinst
                                              ${deb_extra}/python/prerm)

# The maintainer scripts, triggers and conffiles, under the names dpkg wants.
foreach(f tools/postinst tools/prerm tools/postrm python/postinst python/prerm)
  string(REPLACE "/" "." src ${f})
  configure_file(deb/${src} ${deb_extra}/${f} COPYONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE
                 OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
configure_file(deb/lib.triggers ${deb_extra}/lib/triggers COPYONLY)
file(WRITE ${deb_extra}/tools/conffiles "/etc/attnstat/attnstatd.conf\n")

# Every package's /usr/share/doc/PACKAGE: the machine-readable copyright file and the Debian
# changelog (gzip -9n: the same bytes every build). The changelog's entry is dated by
# $SOURCE_DATE_EPOCH when set (reproducible builds), else by the configure. Debian's files only:
# installed by cpack (and cmake --install --component C), not by a plain cmake --install.
set(DEB_VERSION ${deb_version})
set(VERSION ${PROJECT_VERSION})
set(MAJOR ${PROJECT_VERSION_MAJOR})
set(DEB_MAINTAINER "${ATTNSTAT_DEB_MAINTAINER}")
string(TIMESTAMP DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(deb/changelog.in ${deb_extra}/changelog.Debian @ONLY)
add_custom_command(OUTPUT ${deb_extra}/changelog.Debian.gz
  COMMAND gzip -9nf -k ${deb_extra}/changelog.Debian
  DEPENDS ${deb_extra}/changelog.Debian
  COMMENT "changelog.Debian.gz of the Debian packages"
  VERBATIM)
add_custom_target(attnstat_deb_changelog ALL DEPENDS ${deb_extra}/changelog.Debian.gz)
foreach(comp TOOLS LIB DEV PYTHON)
  string(TOLOWER ${comp} c)
  install(FILES deb/copyright ${deb_extra}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${CPACK_DEBIAN_${comp}_PACKAGE_NAME}
          COMPONENT ${c} EXCLUDE_FROM_ALL)
endforeach()

# After cpack has made the packages: what dpkg-gencontrol and dh_makeshlibs do that CPack does not
# (cmake/deb_fixup.cmake), with the archiver of this build.
set(CPACK_POST_BUILD_SCRIPTS ${CMAKE_CURRENT_SOURCE_DIR}/cmake/deb_fixup.cmake)
set(CPACK_ATTNSTAT_AR ${CMAKE_AR})

include(CPack)
