# TRAINSUP_SANITIZE=thread|address builds everything with that sanitizer. The ThreadSanitizer
# build is what CI uses for the watchdog and writer tests (docs/CONTRIBUTING.md).
if(TRAINSUP_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(TRAINSUP_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(NOT TRAINSUP_SANITIZE STREQUAL "")
  message(FATAL_ERROR "TRAINSUP_SANITIZE='${TRAINSUP_SANITIZE}' is not one of '', 'thread', 'address'")
endif()
