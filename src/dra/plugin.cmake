# The kubelet side of the DRA driver (issue 22): claim parsing, the checkpoint, registration, the
# DRAPlugin v1/v1beta1 services and the device health stream.
add_library(gpulet_dra_plugin STATIC claim.cc checkpoint.cc plugin.cc)
target_include_directories(gpulet_dra_plugin PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(gpulet_dra_plugin PUBLIC gpulet_dra_names gpulet_k8s gpulet_k8s_quantity
                      gpulet_proto gpulet_common nlohmann_json::nlohmann_json gpulet_log
                      Threads::Threads)

gpulet_add_test(dra_claim_test SOURCES claim_test.cc LIBS gpulet_dra_plugin)
gpulet_add_test(dra_checkpoint_test SOURCES checkpoint_test.cc LIBS gpulet_dra_plugin)
# The tests' Preparer (recording, able to fail half-way): plugin tests, the kubelet harness tests
# and the benchmark.
add_library(gpulet_dra_fake_preparer STATIC fake_preparer.cc)
target_link_libraries(gpulet_dra_fake_preparer PUBLIC gpulet_dra_plugin)
gpulet_add_test(dra_plugin_test SOURCES plugin_test.cc
                LIBS gpulet_dra_plugin gpulet_dra_fake_preparer gpulet_fake_apiserver gRPC::grpc++)

# The health stream fed from the NVML health board.
add_library(gpulet_dra_health STATIC health_stream.cc)
target_link_libraries(gpulet_dra_health PUBLIC gpulet_dra_plugin gpulet_gpu)
gpulet_add_test(dra_health_stream_test SOURCES health_stream_test.cc
                LIBS gpulet_dra_health gpulet_dra_fake_preparer gRPC::grpc++)
