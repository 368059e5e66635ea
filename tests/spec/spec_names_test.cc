// The names people type (spec/spec_names.h): transformers / TRL / Axolotl aliases read into
// their JobSpec fields, key=value overrides, and every unknown key reported at once with the
// nearest valid names; through the public parsers of spec/job_spec.h.
#include "spec/spec_names.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job_spec.pb.h"
#include "spec/job_spec.h"

namespace lspo::spec {
namespace {

namespace v1 = lspo::v1;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(SpecNamesTest, TransformersTrlAndAxolotlNamesReadIntoTheirFields) {
  auto spec = ParseJobSpecYaml(R"(
model_name_or_path: models/smollm2
learning_rate: 3.0e-4
weight_decay: 0.01
max_grad_norm: 0.5
adam_beta1: 0.8
adam_beta2: 0.95
adam_epsilon: 1.0e-6
warmup_steps: 7
lr_scheduler_type: linear
max_steps: 40
per_device_train_batch_size: 4
gradient_accumulation_steps: 2
max_seq_length: 256
gradient_checkpointing: true
eval_steps: 10
save_steps: 20
save_total_limit: 3
lora_r: 16
lora_alpha: 32
lora_target_modules: [q_proj, v_proj]
)",
                               "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().path(), "models/smollm2");
  EXPECT_EQ(spec->optim().lr(), 3.0e-4);
  EXPECT_EQ(spec->optim().weight_decay(), 0.01);
  EXPECT_EQ(spec->optim().max_grad_norm(), 0.5);
  EXPECT_EQ(spec->optim().beta1(), 0.8);
  EXPECT_EQ(spec->optim().beta2(), 0.95);
  EXPECT_EQ(spec->optim().eps(), 1.0e-6);
  EXPECT_EQ(spec->optim().warmup_steps(), 7);
  EXPECT_EQ(spec->optim().schedule(), v1::LR_SCHEDULE_LINEAR);
  EXPECT_EQ(spec->steps(), 40);
  EXPECT_EQ(spec->micro_batch_size(), 4);
  EXPECT_EQ(spec->grad_accum(), 2);
  EXPECT_EQ(spec->seq_len(), 256);
  EXPECT_TRUE(spec->has_activation_checkpointing() && spec->activation_checkpointing());
  EXPECT_EQ(spec->eval_every(), 10);
  EXPECT_EQ(spec->checkpoint_every(), 20);
  EXPECT_EQ(spec->keep_checkpoints(), 3);
  EXPECT_EQ(spec->lora().r(), 16);
  EXPECT_EQ(spec->lora().alpha(), 32);
  ASSERT_EQ(spec->lora().target_modules_size(), 2);
  EXPECT_EQ(spec->lora().target_modules(1), "v_proj");
  // Axolotl's spellings, and the same through the JSON parser.
  auto axolotl = ParseJobSpecYaml("base_model: m\nsequence_len: 64\nlr_scheduler: cosine\n");
  ASSERT_TRUE(axolotl.ok()) << axolotl.status();
  EXPECT_EQ(axolotl->model().path(), "m");
  EXPECT_EQ(axolotl->seq_len(), 64);
  EXPECT_EQ(axolotl->optim().schedule(), v1::LR_SCHEDULE_COSINE);
  auto json = ParseJobSpecJson(R"({"learning_rate": 0.001, "max_length": 32})");
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->optim().lr(), 0.001);
  EXPECT_EQ(json->seq_len(), 32);
  // Every alias names a real field (a dotted one inside its parent mapping).
  for (const SpecAlias& a : SpecAliases()) {
    const size_t dot = a.alias.rfind('.');
    const std::string yaml =
        dot == absl::string_view::npos
            ? absl::StrCat(a.alias, ": null\n")
            : absl::StrCat(a.alias.substr(0, dot), ":\n  ", a.alias.substr(dot + 1), ": null\n");
    EXPECT_TRUE(ParseJobSpecYaml(yaml).ok()) << a.alias;
  }
}

// This project's clearer names of its own fields: lsp.refit_threshold for lsp.alpha (a refit
// threshold, not a LoRA alpha), the MiB spellings of the _mb fields; in the file, as overrides,
// and refused when they disagree with the old name.
TEST(SpecNamesTest, ClearerNamesOfOwnFieldsKeepTheOldOnesWorking) {
  auto spec = ParseJobSpecYaml(
      "lsp:\n  refit_threshold: 0.5\n  calibration_memory_mib: 256\n"
      "device_memory_limit_mib: 4096\nlora:\n  alpha: 16\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->lsp().alpha(), 0.5);
  EXPECT_EQ(spec->lsp().calibration_memory_mb(), 256);
  EXPECT_EQ(spec->device_memory_limit_mb(), 4096u);
  EXPECT_DOUBLE_EQ(spec->lora().alpha(), 16.0);
  auto old = ParseJobSpecYaml("lsp:\n  alpha: 0.5\ndevice_memory_limit_mb: 4096\n");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_DOUBLE_EQ(old->lsp().alpha(), 0.5);
  auto both = ParseJobSpecYaml("lsp:\n  alpha: 0.5\n  refit_threshold: 0.7\n", "b.yaml");
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(), HasSubstr("lsp.refit_threshold"));
  auto over = ParseJobSpecYaml("steps: 1\n", "o.yaml",
                               {"lsp.refit_threshold=0.6", "device_memory_limit_mib=2048"});
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_DOUBLE_EQ(over->lsp().alpha(), 0.6);
  EXPECT_EQ(over->device_memory_limit_mb(), 2048u);
}

TEST(SpecNamesTest, ScheduleValuesAndTheUnsetMaxStepsOfTransformers) {
  auto warm = ParseJobSpecYaml("lr_scheduler_type: constant_with_warmup\nmax_steps: -1\n");
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(warm->optim().schedule(), v1::LR_SCHEDULE_CONSTANT);
  EXPECT_EQ(warm->steps(), 0);  // -1 is transformers' "not set".
  auto min_lr = ParseJobSpecYaml("lr_scheduler_type: cosine_with_min_lr\n");
  ASSERT_TRUE(min_lr.ok()) << min_lr.status();
  EXPECT_EQ(min_lr->optim().schedule(), v1::LR_SCHEDULE_COSINE);
  auto poly = ParseJobSpecYaml("lr_scheduler_type: polynomial\n", "p.yaml");
  EXPECT_EQ(poly.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(poly.status().message(), HasSubstr("optim.schedule = 'polynomial' is not one of"));
  EXPECT_THAT(poly.status().message(), HasSubstr("linear"));
}

TEST(SpecNamesTest, AnAliasAndItsFieldMustAgree) {
  auto same = ParseJobSpecYaml("learning_rate: 0.0003\noptim:\n  lr: 3.0e-4\n");
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->optim().lr(), 3e-4);
  auto differ = ParseJobSpecYaml("learning_rate: 0.001\noptim:\n  lr: 3.0e-4\n", "a.yaml");
  EXPECT_EQ(differ.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(differ.status().message(),
              HasSubstr("learning_rate (the transformers name of optim.lr) is 0.001 but "
                        "optim.lr is 0.0003"));
  EXPECT_THAT(differ.status().message(), HasSubstr("a.yaml"));
  // Two aliases of one field; a field written in its JSON (lowerCamelCase) name.
  auto two = ParseJobSpecYaml("max_length: 64\nmax_seq_length: 128\n");
  EXPECT_THAT(two.status().message(),
              HasSubstr("max_length (the TRL name of seq_len) is 64 but seq_len is 128"));
  auto scalar = ParseJobSpecYaml("optim: 5\nlearning_rate: 1\n", "s.yaml");
  EXPECT_THAT(scalar.status().message(), HasSubstr("job spec s.yaml: optim: 5: optim here is"));
  EXPECT_THAT(scalar.status().message(),
              HasSubstr("learning_rate: 'optim.lr': the spec's optim is not a mapping"));
  // Every disagreement at once.
  auto three = ParseJobSpecYaml("max_length: 64\nseq_len: 128\nlr_scheduler: cosine\n"
                                "optim:\n  schedule: constant\n");
  EXPECT_THAT(three.status().message(), HasSubstr("max_length (the TRL name of seq_len)"));
  EXPECT_THAT(three.status().message(), HasSubstr("lr_scheduler (the Axolotl name of"));
  auto camel = ParseJobSpecJson(R"({"microBatchSize": 4, "per_device_train_batch_size": 2})");
  EXPECT_THAT(camel.status().message(), HasSubstr("micro_batch_size is 4"));
}

TEST(SpecNamesTest, OverridesSetAnyFieldAfterTheFile) {
  const std::string yaml = "optim:\n  lr: 3.0e-4\nmicroBatchSize: 4\nsteps: 5\n";
  auto spec = ParseJobSpecYaml(
      yaml, "o.yaml",
      {"learning_rate=1e-3", "micro_batch_size=2", "lora.target_modules=[q_proj, k_proj, v_proj]",
       "mode=lora", "data.train_path=a b.jsonl", "max_steps=9"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->optim().lr(), 1e-3);  // The override wins over the file's field.
  EXPECT_EQ(spec->micro_batch_size(), 2);
  EXPECT_EQ(spec->lora().target_modules_size(), 3);
  EXPECT_EQ(spec->mode(), v1::MODE_LORA);
  EXPECT_EQ(spec->data().train_path(), "a b.jsonl");
  EXPECT_EQ(spec->steps(), 9);

  auto empty = ParseJobSpecYaml(yaml, "o.yaml", {"learning_rate="});
  EXPECT_THAT(empty.status().message(),
              HasSubstr("override 'learning_rate=' has no value; write learning_rate=VALUE"));
  auto empty_string = ParseJobSpecYaml(yaml, "o.yaml", {"name=''"});
  ASSERT_TRUE(empty_string.ok()) << empty_string.status();
  EXPECT_EQ(empty_string->name(), "");
  auto no_eq = ParseJobSpecYaml(yaml, "o.yaml", {"steps"});
  EXPECT_THAT(no_eq.status().message(), HasSubstr("override 'steps' is not key=value"));
  auto typo = ParseJobSpecYaml(yaml, "o.yaml", {"optim.lrr=1"});
  EXPECT_THAT(typo.status().message(), HasSubstr("'optim.lrr' names no field of optim"));
  EXPECT_THAT(typo.status().message(), HasSubstr("did you mean lr"));
  auto scalar = ParseJobSpecYaml(yaml, "o.yaml", {"steps.x=1"});
  EXPECT_THAT(scalar.status().message(), HasSubstr("steps holds a value, not fields"));
  auto bad_value = ParseJobSpecYaml(yaml, "o.yaml", {"steps=[1"});
  EXPECT_THAT(bad_value.status().message(), HasSubstr("the value is not valid YAML"));
  auto wrong_type = ParseJobSpecYaml(yaml, "o.yaml", {"steps=many"});
  EXPECT_FALSE(wrong_type.ok());
  EXPECT_THAT(wrong_type.status().message(), HasSubstr("steps"));
}

TEST(SpecNamesTest, EveryUnknownKeyIsReportedAtOnceWithTheNearestNames) {
  auto spec = ParseJobSpecYaml(R"(
stpes: 3
learning_rat: 0.1
optim:
  lrr: 0.1
  wieght_decay: 0
lora:
  target_modules: [q_proj]
xyzzy: 1
)",
                               "u.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(spec.status().message());
  EXPECT_THAT(m, HasSubstr("job spec u.yaml: 5 unknown fields"));
  EXPECT_THAT(m, HasSubstr("'stpes' (did you mean steps"));
  EXPECT_THAT(m, HasSubstr("'learning_rat' (did you mean learning_rate"));
  EXPECT_THAT(m, HasSubstr("'optim.lrr' (did you mean optim.lr"));
  EXPECT_THAT(m, HasSubstr("'optim.wieght_decay' (did you mean optim.weight_decay"));
  EXPECT_THAT(m, HasSubstr("'xyzzy'"));
  EXPECT_THAT(m, Not(HasSubstr("'xyzzy' (did")));  // Nothing near: no suggestion.
  EXPECT_THAT(m, Not(HasSubstr("target_modules")));
  // One unknown key: singular.
  auto one = ParseJobSpecJson(R"({"sed": 1})", "one.json");
  EXPECT_THAT(one.status().message(), HasSubstr("1 unknown field: 'sed' (did you mean seed"));
  // Many keys, one of them huge: the first 20 listed, long names cut, no suggestions for them.
  // (JSON: YAML's plain keys stop at 1024 characters.)
  std::string many = "{";
  for (int i = 0; i < 25; ++i) absl::StrAppend(&many, "\"k", 10 + i, "\": 1, ");
  absl::StrAppend(&many, "\"", std::string(100000, 's'), "\": 1}");
  auto lots = ParseJobSpecJson(many, "many.yaml");
  const std::string lm(lots.status().message());
  EXPECT_THAT(lm, HasSubstr("26 unknown fields: 'k10', "));
  EXPECT_THAT(lm, HasSubstr("'k29', and 6 more."));
  EXPECT_LT(lm.size(), 2000u);
}

// epochs (num_train_epochs) and optim.warmup_ratio, counted as transformers' Trainer counts
// them: steps per epoch = max(1, len(dataloader) // gradient_accumulation_steps), the
// dataloader keeping its last partial batch; steps = ceil(epochs * per epoch).
TEST(SpecNamesTest, EpochsAndWarmupRatioAreTransformersCounts) {
  auto spec = ParseJobSpecYaml("num_train_epochs: 1.5\nwarmup_ratio: 0.1\nmax_steps: -1\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->epochs(), 1.5);
  EXPECT_EQ(spec->optim().warmup_ratio(), 0.1);
  EXPECT_EQ(spec->steps(), 0);
  v1::JobSpec s = *spec;
  s.set_micro_batch_size(2);
  s.set_grad_accum(2);
  EXPECT_EQ(StepsForEpochs(s, 64), 24);  // 32 batches, 16 steps an epoch, x 1.5
  EXPECT_EQ(StepsForEpochs(s, 65), 24);  // 33 batches: still 16 steps an epoch
  EXPECT_EQ(StepsForEpochs(s, 67), 26);  // 34 batches: 17
  s.mutable_distributed()->set_world_size(2);
  EXPECT_EQ(StepsForEpochs(s, 64), 12);  // 2 ranks: 16 batches of 4 rows, 8 steps an epoch
  s.clear_distributed();
  s.set_grad_accum(4);
  EXPECT_EQ(StepsForEpochs(s, 3), 2);  // 2 batches < 4: one step an epoch, ceil(1.5)
  s.set_epochs(0.01);
  EXPECT_EQ(StepsForEpochs(s, 64), 1);  // never 0

  // On the command line, a length replaces the other kind of length.
  auto steps = ParseJobSpecYaml("epochs: 2\n", "e.yaml", {"max_steps=5"});
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(steps->steps(), 5);
  EXPECT_EQ(steps->epochs(), 0);
  auto epochs = ParseJobSpecYaml("steps: 4\n", "e.yaml", {"num_train_epochs=3"});
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  EXPECT_EQ(epochs->steps(), 0);
  EXPECT_EQ(epochs->epochs(), 3);

  // The checks, on the smoke job.
  auto job = LoadJobSpecFile("examples/tiny-moby-dick.yaml", {"epochs=2", "warmup_ratio=0.1"});
  ASSERT_TRUE(job.ok()) << job.status();
  ResolveDefaults(&*job);
  EXPECT_TRUE(ValidateJobSpec(*job).ok()) << ValidateJobSpec(*job);
  v1::JobSpec both = *job;
  both.set_steps(4);
  EXPECT_THAT(ValidateJobSpec(both).message(),
              HasSubstr("steps = 4 is invalid: the spec also sets epochs = 2"));
  v1::JobSpec neither = *job;
  neither.clear_epochs();
  EXPECT_THAT(ValidateJobSpec(neither).message(),
              HasSubstr("run at least 1 step: set steps (max_steps) >= 1, or epochs "
                        "(num_train_epochs) > 0"));
  v1::JobSpec warm = *job;
  warm.mutable_optim()->set_warmup_steps(3);
  EXPECT_THAT(ValidateJobSpec(warm).message(),
              HasSubstr("optim.warmup_ratio = 0.1 is invalid: the spec also sets "
                        "optim.warmup_steps = 3"));
  v1::JobSpec ratio = *job;
  ratio.mutable_optim()->set_warmup_ratio(1.0);  // transformers allows the whole run: [0, 1]
  EXPECT_TRUE(ValidateJobSpec(ratio).ok()) << ValidateJobSpec(ratio);
  ratio.mutable_optim()->set_warmup_ratio(1.5);
  EXPECT_THAT(ValidateJobSpec(ratio).message(), HasSubstr("in [0, 1]"));
  v1::JobSpec negative = *job;
  negative.set_epochs(-1);
  EXPECT_THAT(ValidateJobSpec(negative).message(), HasSubstr("job spec field epochs = -1"));
  // How long is not what is trained: a resumed job may train more epochs.
  v1::JobSpec longer = *job;
  longer.set_epochs(5);
  EXPECT_TRUE(SameTraining(TrainingFingerprint(*job), longer));
}

// Keys of those tools that are no field here: translated, dropped (nothing lost) or refused
// (dropping them would change the training), every refusal in one message.
TEST(SpecNamesTest, TheirOtherKeysAreTranslatedDroppedOrRefused) {
  auto spec = ParseJobSpecYaml(R"(
bf16: true
packing: true
optim: adamw_torch
lora_dropout: 0.0
fp16: false
logging_steps: 10
report_to: tensorboard
eval_strategy: steps
save_strategy: steps
per_device_eval_batch_size: 8
run_name: my-run
dataset_text_field: text
steps: 3
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->weight_dtype(), v1::WEIGHT_DTYPE_BF16);
  EXPECT_TRUE(spec->data().packing());
  EXPECT_EQ(spec->steps(), 3);
  auto fp32 = ParseJobSpecYaml("bf16: false\nweight_dtype: fp32\n");
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ(fp32->weight_dtype(), v1::WEIGHT_DTYPE_FP32);

  auto bad = ParseJobSpecYaml(R"(
bf16: true
weight_dtype: fp32
fp16: true
optim: sgd
lora_dropout: 0.05
dataset_text_field: content
)",
                              "hf.yaml");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(bad.status().message());
  EXPECT_THAT(m, HasSubstr("job spec hf.yaml: "));
  EXPECT_THAT(m, HasSubstr("bf16: true: it means weight_dtype: bf16 but the spec sets "
                           "weight_dtype: \"fp32\""));
  EXPECT_THAT(m, HasSubstr("fp16: true: fp16 weights are not offered"));
  EXPECT_THAT(m, HasSubstr("optim: \"sgd\": optim here is the block of AdamW settings"));
  EXPECT_THAT(m, HasSubstr("lora_dropout: 0.05: this product's LoRA has no dropout"));
  EXPECT_THAT(m, HasSubstr("dataset_text_field: \"content\": text records are read from"));
  // A top-level key that is a nested field, or a short name: the nested field is suggested.
  auto nested = ParseJobSpecYaml("r: 8\nlr: 0.1\n");
  EXPECT_THAT(nested.status().message(), HasSubstr("'r' (did you mean lora.r"));
  EXPECT_THAT(nested.status().message(), HasSubstr("'lr' (did you mean optim.lr"));
}

// Overrides: taken as typed by string fields, comma lists for list fields, one field once,
// max_steps=-1 as transformers means it, every bad override reported at once.
TEST(SpecNamesTest, OverridesAreTypedByTheirFieldsAndReportedTogether) {
  auto spec = ParseJobSpecYaml("epochs: 2\n", "o.yaml",
                               {"name=007", "lora.target_modules=q_proj, v_proj",
                                "data.system_prompt=true", "max_steps=-1", "bf16=false"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "007");
  ASSERT_EQ(spec->lora().target_modules_size(), 2);
  EXPECT_EQ(spec->lora().target_modules(0), "q_proj");
  EXPECT_EQ(spec->lora().target_modules(1), "v_proj");
  EXPECT_EQ(spec->data().system_prompt(), "true");
  EXPECT_EQ(spec->epochs(), 2);  // max_steps=-1: the epochs decide
  EXPECT_EQ(spec->steps(), 0);
  EXPECT_EQ(spec->weight_dtype(), v1::WEIGHT_DTYPE_FP32);
  // In a file, too: a number in a string field, one string for a list.
  auto file = ParseJobSpecYaml("name: 123\nlora:\n  target_modules: q_proj\n");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->name(), "123");
  EXPECT_EQ(file->lora().target_modules_size(), 1);

  auto bad = ParseJobSpecYaml("steps: 2\n", "o.yaml",
                              {"learning_rate=1e-3", "optim.lr=2e-3", "stepz=1", "lorra.r=2"});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string m(bad.status().message());
  EXPECT_THAT(m, HasSubstr("override 'optim.lr=2e-3': optim.lr is set by an earlier override"));
  EXPECT_THAT(m, HasSubstr("override 'stepz=1': 'stepz' names no field (did you mean steps"));
  EXPECT_THAT(m, HasSubstr("override 'lorra.r=2': 'lorra.r' names no field (did you mean lora"));
}

// A key twice in one mapping loses one of its values: refused in YAML and JSON.
TEST(SpecNamesTest, AKeyTwiceInOneMappingIsRefused) {
  auto yaml = ParseJobSpecYaml("steps: 2\noptim:\n  lr: 1\n  lr: 2\n", "d.yaml");
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(yaml.status().message(), HasSubstr("the key 'lr' appears twice in one mapping"));
  auto json = ParseJobSpecJson(R"({"steps": 2, "optim": {"lr": 1}, "steps": 3})", "d.json");
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(json.status().message(),
              HasSubstr("job spec d.json: the key 'steps' appears twice in one object"));
  // The same key in two objects is fine.
  auto apart = ParseJobSpecJson(R"({"lora": {"r": 2}, "lsp": {"r": 2}, "steps": 1})");
  EXPECT_TRUE(apart.ok()) << apart.status();
}

// A model id ("org/name", model_name_or_path) is read from the local Hugging Face cache as
// transformers reads it offline: refs/main's snapshot, whose files link to blobs/ (as
// huggingface_hub lays them out); an id the cache lacks is an error naming the cache.
TEST(SpecNamesTest, AModelIdIsFoundInTheHuggingFaceCache) {
  namespace fs = std::filesystem;
  const fs::path cache = fs::path(::testing::TempDir()) / "spec_hf_cache";
  fs::remove_all(cache);
  const fs::path repo = cache / "models--tiny-org--llama-job";
  const fs::path snapshot = repo / "snapshots" / "3f2a9c";
  fs::create_directories(snapshot);
  fs::create_directories(repo / "blobs");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::copy_file(fs::path("tests/oracle/data/hf_models/llama-job") / f, repo / "blobs" / f);
    fs::create_symlink(fs::path("../../blobs") / f, snapshot / f);
  }
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "3f2a9c";
  const std::string chat = (fs::path(::testing::TempDir()) / "spec_sharegpt.jsonl").string();
  std::ofstream(chat) << R"({"conversations": [{"from": "human", "value": "q"}, )"
                      << R"({"from": "gpt", "value": "a"}]})" << "\n";
  setenv("HF_HUB_CACHE", cache.c_str(), 1);
  auto spec = ParseJobSpecYaml(absl::StrCat("model_name_or_path: tiny-org/llama-job\n",
                                            "data: {train_path: ", chat, "}\nsteps: 1\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ResolveDefaults(&*spec);
  EXPECT_EQ(spec->model().path(), snapshot.string());
  EXPECT_EQ(spec->model().format(), v1::MODEL_FORMAT_HF);
  EXPECT_EQ(spec->model().tokenizer_path(), snapshot.string());
  EXPECT_EQ(spec->data().format(), v1::DATA_FORMAT_CHAT);  // ShareGPT's "conversations"
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);

  auto absent = ParseJobSpecYaml("model: {path: tiny-org/absent}\ndata: {train_path: x}\n");
  ASSERT_TRUE(absent.ok()) << absent.status();
  ResolveDefaults(&*absent);
  const absl::Status st = ValidateJobSpec(*absent);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("job spec field model.path: model 'tiny-org/absent' is not "
                                      "in the Hugging Face cache " +
                                      cache.string()));
  // A relative path that exists is a path, even when it has an id's shape.
  auto local = ParseJobSpecYaml("model: {path: tests/oracle}\ndata: {train_path: x}\n");
  ASSERT_TRUE(local.ok());
  ResolveDefaults(&*local);
  EXPECT_EQ(local->model().path(), "tests/oracle");
  unsetenv("HF_HUB_CACHE");
}

// save_dtype unset is the input's dtype (config.json's torch_dtype / dtype bfloat16 -> bf16,
// anything else fp32); a value given is kept.
TEST(SpecNamesTest, TheSaveDtypeIsTheInputsUnlessGiven) {
  for (const auto& [path, want] : std::vector<std::pair<std::string, v1::WeightDtype>>{
           {"tests/oracle/data/hf_models/llama-bf16", v1::WEIGHT_DTYPE_BF16},
           {"tests/oracle/data/hf_models/llama-fp32", v1::WEIGHT_DTYPE_FP32},
           {"models/SmolLM2-135M-Instruct.Q4_1.gguf", v1::WEIGHT_DTYPE_FP32}}) {
    auto spec = ParseJobSpecYaml(absl::StrCat("model: {path: ", path, "}\nsteps: 1\n"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    ResolveDefaults(&*spec);
    EXPECT_EQ(spec->save_dtype(), want) << path;
  }
  auto given = ParseJobSpecYaml(
      "model: {path: tests/oracle/data/hf_models/llama-bf16}\nsave_dtype: fp32\n");
  ASSERT_TRUE(given.ok()) << given.status();
  ResolveDefaults(&*given);
  EXPECT_EQ(given->save_dtype(), v1::WEIGHT_DTYPE_FP32);
  // What is written is not what is trained: a resume may change it.
  v1::JobSpec other = *given;
  other.set_save_dtype(v1::WEIGHT_DTYPE_BF16);
  EXPECT_TRUE(SameTraining(TrainingFingerprint(*given), other));
}

}  // namespace
// Data in the forms people have but a job does not read -- parquet / Arrow files, a saved
// Hugging Face dataset folder -- is refused by name with the conversion, never read as text.
TEST(SpecNamesTest, ParquetAndSavedDatasetsAreRefusedWithTheConversion) {
  auto job = LoadJobSpecFile("examples/tiny-moby-dick.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  ResolveDefaults(&*job);
  v1::JobSpec parquet = *job;
  parquet.mutable_data()->set_train_path("train-00000-of-00001.parquet");
  absl::Status st = ValidateJobSpec(parquet, /*check_data_files=*/false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("data.train_path"));
  EXPECT_THAT(st.message(), HasSubstr("lspo.to_jsonl('train-00000-of-00001.parquet'"));
  const std::string saved = ::testing::TempDir() + "/saved-dataset";
  std::filesystem::create_directories(saved);
  std::ofstream(saved + "/dataset_info.json") << "{}";
  v1::JobSpec folder = *job;
  folder.mutable_data()->set_eval_path(saved);
  st = ValidateJobSpec(folder, /*check_data_files=*/false);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("data.eval_path"));
  EXPECT_THAT(st.message(), HasSubstr("load_from_disk"));
  std::filesystem::remove_all(saved);
}

// lsp.refresh_every: a count of steps (>= 0), and no refresh at all (master_refresh: never)
// contradicts it; both refusals name the field.
TEST(SpecNamesTest, RefreshEveryIsCheckedAgainstMasterRefresh) {
  auto job = LoadJobSpecFile("examples/smollm2-sms-spam.yaml", {"lsp.refresh_every=50"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->lsp().refresh_every(), 50);
  ResolveDefaults(&*job);
  EXPECT_TRUE(ValidateJobSpec(*job).ok()) << ValidateJobSpec(*job);
  v1::JobSpec negative = *job;
  negative.mutable_lsp()->set_refresh_every(-1);
  EXPECT_THAT(ValidateJobSpec(negative).message(),
              HasSubstr("lsp.refresh_every = -1 is invalid: must be >= 0"));
  v1::JobSpec never = *job;
  never.mutable_lsp()->set_master_refresh(v1::MASTER_REFRESH_NEVER);
  EXPECT_THAT(ValidateJobSpec(never).message(),
              HasSubstr("lsp.master_refresh: never asks for no refresh at all"));
  never.mutable_lsp()->set_refresh_every(0);
  EXPECT_TRUE(ValidateJobSpec(never).ok()) << ValidateJobSpec(never);
}

// A checkpoint's fingerprint leaves out a compensated rounding and refresh_every 0, and one
// written before 2026-12-07 has no rounding when the default (then compensated) ran: a resume
// that leaves them unset takes compensated and 0; written ones are taken as they are; the
// spec's own settings stand.
TEST(SpecNamesTest, AResumeTakesTheRoundingItsCheckpointTrainedWith) {
  v1::JobSpec old_job;
  TakeChosenSettingsFrom(R"({"mode":"lsp","lsp":{"d":16}})", &old_job);
  EXPECT_EQ(old_job.lsp().apply_rounding(), v1::APPLY_ROUNDING_COMPENSATED);
  ASSERT_TRUE(old_job.lsp().has_refresh_every());
  EXPECT_EQ(old_job.lsp().refresh_every(), 0);
  v1::JobSpec new_job;
  TakeChosenSettingsFrom(R"({"lsp":{"apply_rounding":"stochastic","refresh_every":100}})",
                         &new_job);
  EXPECT_EQ(new_job.lsp().apply_rounding(), v1::APPLY_ROUNDING_STOCHASTIC);
  EXPECT_EQ(new_job.lsp().refresh_every(), 100);
  v1::JobSpec own;
  own.mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_NEAREST);
  own.mutable_lsp()->set_refresh_every(7);
  TakeChosenSettingsFrom(R"({"lsp":{"apply_rounding":"stochastic","refresh_every":100}})", &own);
  EXPECT_EQ(own.lsp().apply_rounding(), v1::APPLY_ROUNDING_NEAREST);
  EXPECT_EQ(own.lsp().refresh_every(), 7);
  // Written out or left unset, compensated and no refresh are the same training.
  v1::JobSpec a, b;
  a.mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_COMPENSATED);
  a.mutable_lsp()->set_refresh_every(0);
  EXPECT_EQ(TrainingFingerprint(a), TrainingFingerprint(b));
}

}  // namespace lspo::spec
