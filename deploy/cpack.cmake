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

set(CPACK_DEBIAN_PACKAGE_MAINTAINER "attnstat maintainers <attnstat@localhost>")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
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
attnstatd receives the query and key tensors of training processes (host tensors
through shared memory, GPU tensors by CUDA IPC handle), computes per-row attention
entropy and max logit, keeps per-(layer, head) history in SQLite and raises alerts
(entropy collapse, logit growth, non-finite logits). attnstat shows trends, heatmaps,
alerts and the daemon's live status. Runs as the systemd service attnstatd.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_CONTROL_EXTRA
    ${deb_extra}/tools/postinst ${deb_extra}/tools/prerm ${deb_extra}/tools/postrm
    ${deb_extra}/tools/conffiles)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libattnstat${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_LIB_DESCRIPTION
"client library of attnstatd (attention monitoring)
libattnstat hands a training job's attention tensors to attnstatd without ever
blocking the caller, and reconnects by itself when the daemon restarts.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libattnstat-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libattnstat${PROJECT_VERSION_MAJOR} (= ${deb_version})")
set(CPACK_DEBIAN_DEV_DESCRIPTION
"client library of attnstatd (development files)
The header attnstat.h, pkg-config (attnstat.pc) and CMake (find_package(attnstat),
target attnstat::attnstat) files of libattnstat.")

set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-attnstat)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS
    "python3:any, libattnstat${PROJECT_VERSION_MAJOR} (>= ${PROJECT_VERSION})")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS "python3-numpy")
set(CPACK_DEBIAN_PYTHON_DESCRIPTION
"client of attnstatd for Python (attention monitoring)
import attnstat: pushes PyTorch, NumPy or CuPy tensors to attnstatd (CUDA tensors
without a copy), and attnstat.torch monitors an unmodified PyTorch model.")
set(CPACK_DEBIAN_PYTHON_PACKAGE_CONTROL_EXTRA ${deb_extra}/python/postinst ${deb_extra}/python/prerm)

# The maintainer scripts and conffiles, under the names dpkg wants.
foreach(f tools/postinst tools/prerm tools/postrm python/postinst python/prerm)
  string(REPLACE "/" "." src ${f})
  configure_file(deb/${src} ${deb_extra}/${f} COPYONLY FILE_PERMISSIONS
                 OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
file(WRITE ${deb_extra}/tools/conffiles "/etc/attnstat/attnstatd.conf\n")

include(CPack)
