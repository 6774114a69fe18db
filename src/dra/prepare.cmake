# The device side of a Prepare (issue 22 item 3): CDI specs, dynamic MIG placements, memory-share
# limits, opaque config. MakeNodePreparer (node_preparer.h) is what the kubelet plugin calls.
add_library(gpulet_dra_prepare STATIC cdi.cc opaque_config.cc node_preparer.cc)
target_include_directories(gpulet_dra_prepare PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(gpulet_dra_prepare PUBLIC gpulet_dra_names gpulet_gpu gpulet_mig
                      gpulet_cudashim_limits_dir gpulet_k8s_quantity gpulet_common gpulet_yaml
                      nlohmann_json::nlohmann_json gpulet_log)

gpulet_add_test(dra_prepare_test
  SOURCES cdi_test.cc opaque_config_test.cc node_preparer_test.cc
  LIBS gpulet_dra_prepare gpulet_sim)
add_dependencies(dra_prepare_test nvidia_ml_sim)

# The production MpsControl: per-claim MPS daemons through mps::Supervisor.
add_library(gpulet_dra_mps STATIC mps_control.cc)
target_link_libraries(gpulet_dra_mps PUBLIC gpulet_dra_prepare gpulet_mps)
gpulet_add_test(dra_mps_control_test SOURCES mps_control_test.cc
  LIBS gpulet_dra_mps gpulet_sim LABELS integration sanitize)
add_dependencies(dra_mps_control_test nvidia_ml_sim mps_control_standin)

# End to end (tests/dra/prepare_e2e_test.cc): a memory share prepared here holds in a "container"
# made from the claim's CDI spec (root: a private mount namespace). Not under the sanitizers: the
# preloaded library reaches every process of the namespace.
gpulet_add_test(dra_prepare_e2e_test SOURCES ${CMAKE_SOURCE_DIR}/tests/dra/prepare_e2e_test.cc
  LIBS gpulet_dra_prepare gpulet_cudashim_region gpulet_sim gpulet_common
  LABELS integration)
if(TARGET dra_prepare_e2e_test)
  target_include_directories(dra_prepare_e2e_test PRIVATE ${CMAKE_SOURCE_DIR}/testing
                             ${CMAKE_SOURCE_DIR})
  add_dependencies(dra_prepare_e2e_test memlimit_probe gpulet_cuda cuda_sim nvidia_ml_sim)
endif()
