"""The paper's LM programs as one benchmark: `python -m radixlm.bench.programs`.

Workloads (radixlm programs, workloads.py) on seeded synthetic data (data.py). Lengths are in words, about one
token each; `--scale` multiplies every length and output budget (CPU runs use 0.1-0.25):

| workload            | shape                                                                                   |
|---------------------|-----------------------------------------------------------------------------------------|
| mmlu                | a subject per 16 questions, 5 shots each (question 20-60 words, 4 choices of 2-10,      |
|                     | the letter); a question after its subject's shared 5-shot prefix; gen of 1 token        |
| hellaswag           | one 20-shot prefix (context 20-40 + ending 8-20 words per shot) shared by every question; |
|                     | context 20-40 words; select among 4 endings of 8-20 words (two-level sharing)             |
| react               | shared instruction + a 3-step example trajectory; question; 4 steps of Thought (gen 32,  |
|                     | stop \\n) / Action (gen 12) / replayed Observation (30-60 words)                          |
| generative_agents   | an agent (persona 60-100 words + 12 memories of 10-25) per 4 programs; an observation;   |
|                     | plan (gen 32), react? (select yes/no), utterance (gen 32)                                |
| tree_of_thought     | 2-shot GSM-style header, question 30-60 words; fork 3 plans (gen 48), each fork 2        |
|                     | solutions (gen 96), each judged with select yes/no: 3 + 6 branches                        |
| skeleton_of_thought | tip question; skeleton of 3 points (gen 16 each); fork 3 expansions (gen 128); join      |
| llm_judge           | question + 4-sentence answer; fork 5 criteria (gen 64); join; merged score (gen 3)       |
| json_decode         | shared instruction; entity document of 6 sentences; gen constrained by a JSON regex      |
|                     | (name, country, population, 2 tags, is_capital)                                          |
| chat_short          | 4 chat turns, user input 256-512 words, output 4-8 tokens (EOS ignored)                  |
| chat_long           | 4 chat turns, user input 256-512 words, output 256-512 tokens (EOS ignored)              |
| rag                 | DSPy RAG: signature header + 3 demos shared; 3 retrieved passages (40-80 words) from a   |
|                     | 40-passage corpus; chain-of-thought reasoning (gen 48) and answer (gen 8)                |
| llava_bench         | a system prompt (30 words) shared by all; an image of random pixels at LLaVA-bench's      |
|                     | sizes (1024x768, 1280x960, 768x1024; sides x scale, >= 112), then 3 questions of 10-30    |
|                     | words in branches (gen 256 each); only where the server's model takes images             |

Metrics per workload (runner.py): programs/s, mean program latency, output tokens/s, the achieved cache hit rate
(server meta_info cached_tokens / prompt_tokens over every request, record.py) and the optimal hit rate of the
same requests (optimal.py; an image counts as the tokens the server expands it to, record.with_images), with
achieved/optimal. Ablations (runner.VARIANTS): no radix cache, FCFS or random
scheduling, no frontend parallelism, no frontend hints, and all of them off. Report: report.py.
"""
