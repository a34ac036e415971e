# `cmake --install` and find_package(zero): the static libraries, include/zero/, and a package
# whose zero::zero target carries LibTorch (zero::torch, pinned to the LibTorch zero was built
# against: the C++ ABI and version must match), yaml-cpp and Threads.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set_target_properties(zero PROPERTIES EXPORT_NAME zero)
set_target_properties(zero_comm PROPERTIES EXPORT_NAME comm)
set_target_properties(zero_optim PROPERTIES EXPORT_NAME optim)
set_target_properties(zero_offload PROPERTIES EXPORT_NAME offload)
set_target_properties(zero_device PROPERTIES EXPORT_NAME device)
set_target_properties(zero_config PROPERTIES EXPORT_NAME config)
set_target_properties(zero_checkpoint PROPERTIES EXPORT_NAME checkpoint)
set_target_properties(zero_plan PROPERTIES EXPORT_NAME plan)
# The planner reads the pipeline schedules' figures (bubble, in-flight micro-batches).
set_target_properties(zero_pipeline_schedule PROPERTIES EXPORT_NAME pipeline_schedule)
set_target_properties(zero_compress PROPERTIES EXPORT_NAME compress)
set_target_properties(zero_tensor_parallel PROPERTIES EXPORT_NAME tensor_parallel)
set_target_properties(zero_torch PROPERTIES EXPORT_NAME torch)
# The pipeline's runtime and engine (include/zero/pipeline*.hpp), and the models built on the
# public API: zero::models (GPT, tensor-parallel GPT, HF LLaMA) and their torch-free shapes.
set_target_properties(zero_pipeline_runtime PROPERTIES EXPORT_NAME pipeline_runtime)
set_target_properties(zero_pipeline_engine PROPERTIES EXPORT_NAME pipeline)
set_target_properties(zero_models PROPERTIES EXPORT_NAME models)
set_target_properties(zero_model_shapes PROPERTIES EXPORT_NAME model_shapes)
install(TARGETS zero zero_config zero_checkpoint zero_plan zero_pipeline_schedule
                zero_tensor_parallel zero_comm zero_pipeline_runtime zero_pipeline_engine
                zero_models zero_model_shapes
                zero_compress zero_optim zero_offload zero_device zero_torch
        EXPORT zeroTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zero DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/zero)
install(EXPORT zeroTargets NAMESPACE zero:: DESTINATION ${_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroConfig.cmake.in
  ${PROJECT_BINARY_DIR}/zeroConfig.cmake INSTALL_DESTINATION ${_cmake_dir})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroConfig.cmake ${PROJECT_BINARY_DIR}/zeroConfigVersion.cmake
        DESTINATION ${_cmake_dir})
