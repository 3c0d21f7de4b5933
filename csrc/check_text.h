// Text for argument-check messages, shared by every host file of rigel_core._C.
//
// Messages are assembled as one std::string (std::to_string for numbers) and handed to TORCH_CHECK as its only
// message argument, never formatted through std::ostream: on the H200 image this .so is built by a newer g++
// (/opt/gcc) than the libstdc++ loaded at run time, and the ostream code instantiated here crashed the process
// (SIGSEGV in basic_ostream::_M_insert<long>, seen with cuda-gdb) whenever a check formatted a number.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace rigel {

// torch's Python names of the dtypes (c10::toString says "Float" for float32).
inline std::string dtype_name(at::ScalarType t) {
    switch (t) {
        case at::kFloat: return "float32";
        case at::kDouble: return "float64";
        case at::kHalf: return "float16";
        case at::kBFloat16: return "bfloat16";
        case at::kInt: return "int32";
        case at::kLong: return "int64";
        case at::kBool: return "bool";
        default: return c10::toString(t);
    }
}

// "[2, 3]"
inline std::string shape_text_of(at::IntArrayRef sizes) {
    std::string s = "[";
    for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
    return s + "]";
}

}  // namespace rigel
