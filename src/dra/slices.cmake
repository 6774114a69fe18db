# ResourceSlices of the DRA driver: building them from the inventory (slices.cc, pure) and keeping
# the API server in step (publisher.cc); device taints from the health board.
add_library(gpulet_dra_slices STATIC slices.cc publisher.cc)
target_include_directories(gpulet_dra_slices PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(gpulet_dra_slices PUBLIC gpulet_dra_names gpulet_gpu gpulet_mig gpulet_placement
                      gpulet_k8s gpulet_common gpulet_log nlohmann_json::nlohmann_json
                      Threads::Threads)

gpulet_add_test(dra_slices_test SOURCES slices_test.cc publisher_test.cc
  LIBS gpulet_dra_slices gpulet_dra_allocator gpulet_sim gpulet_fake_apiserver)
add_dependencies(dra_slices_test nvidia_ml_sim)
