// The tiny random Llama of the service-core unit tests (tests/cpu_optimizer_service/,
// tests/gpu_worker/): one decoder layer, hidden 16, intermediate 24, 2 heads of 8, 1 KV head,
// so its 7 trained matrices are (16, 16), (8, 16), (8, 16), (16, 16), (24, 16), (24, 16) and
// (16, 24); weights drawn from init seed 1234; the vocabulary of a 2000-token BPE tokenizer
// (tests/oracle/data/hf_tokenizers/misc). Header-only.
#ifndef LSPO_TESTS_TINY_LLAMA_H_
#define LSPO_TESTS_TINY_LLAMA_H_

#include "proto/job_spec.pb.h"

namespace lspo::testing_models {

// The BPE tokenizer (2000 tokens) whose vocabulary sizes the tiny model's embedding.
inline constexpr char kTinyTokenizer[] = "tests/oracle/data/hf_tokenizers/misc";

// Sets `spec`'s model to the tiny random Llama above (model.format, tokenizer, init seed and
// shape; nothing else of the spec).
inline void SetTinyLlama(lspo::v1::JobSpec* spec) {
  auto* m = spec->mutable_model();
  m->set_format(lspo::v1::MODEL_FORMAT_TINY_RANDOM);
  m->set_tokenizer_path(kTinyTokenizer);
  m->set_init_seed(1234);
  auto* shape = m->mutable_random_shape();
  shape->set_hidden_size(16);
  shape->set_intermediate_size(24);
  shape->set_num_hidden_layers(1);
  shape->set_num_attention_heads(2);
  shape->set_num_key_value_heads(1);
}

}  // namespace lspo::testing_models

#endif  // LSPO_TESTS_TINY_LLAMA_H_
