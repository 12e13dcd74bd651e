# Install and export: headers, the static libraries, the shardmm command, and a package
# config, so that another CMake project can write
#   find_package(shardmm REQUIRED)
#   target_link_libraries(app PRIVATE shardmm::shardmm)
include(CMakePackageConfigHelpers)

set(SHARDMM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardmm)

# Every library in shardmm::shardmm's link closure is exported: the libraries are static,
# so a consumer links the private ones (shardmm_mpi) too.
set(shardmm_exported shardmm_core shardmm_plan shardmm_program shardmm_runtime shardmm_autodiff shardmm_nn shardmm_solve shardmm_all)
if(TARGET shardmm_mpi)
  list(APPEND shardmm_exported shardmm_mpi)
  set(SHARDMM_CONFIG_WITH_MPI ON)
else()
  set(SHARDMM_CONFIG_WITH_MPI OFF)
endif()

# The public headers are C++20 (defaulted comparisons): consumers get the standard with
# the targets.

install(TARGETS ${shardmm_exported} EXPORT shardmmTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shardmm
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
if(TARGET shardmm_cli)
  install(TARGETS shardmm_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT shardmmTargets NAMESPACE shardmm:: DESTINATION ${SHARDMM_INSTALL_CMAKEDIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/shardmmConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/shardmmConfig.cmake
                              INSTALL_DESTINATION ${SHARDMM_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardmmConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardmmConfig.cmake ${PROJECT_BINARY_DIR}/shardmmConfigVersion.cmake
        DESTINATION ${SHARDMM_INSTALL_CMAKEDIR})
