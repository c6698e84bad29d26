"""Prompt texts of the inference baselines (searchjax.eval.pipelines), quoted with their sources.

FlashRAG (Jin et al. 2024, github.com/RUC-NLPIR/FlashRAG), the reference for wording:

* Direct (FlashRAG's "zero-shot" method, examples/methods/run_exp.py) and RAG ("Standard RAG", the default
  template of flashrag/prompt/base_prompt.py: system prompt with the documents, user prompt "Question: ...";
  documents listed as "Doc i(Title: t) text"). FlashRAG's source string lacks the space after "document."
  that its own baseline-details page (original_docs/baseline_details.md) shows; we use the documented wording.
* IRCoT (flashrag/pipeline/active_pipeline.py, IRCOTPipeline): its instruction, its one-shot example (from
  IRCoT's 2WikiMultihopQA demonstrations), documents as "Wikipedia Title: t\\ntext\\n\\n", user part
  "{documents}Question: q\\nThought:", the marker "So the answer is:".

Search-o1 (Li et al. 2025, github.com/sunnynexus/Search-o1, scripts/prompts.py), which FlashRAG does not
implement:

* CoT: the open-QA task instruction of its direct-reasoning baseline (`get_task_instruction_openqa`): think
  step by step, final answer in \\boxed{...}.
* Search-o1: the single-hop / multi-hop search instructions (`get_singleqa_search_o1_instruction`,
  `get_multiqa_search_o1_instruction`) followed by that task instruction, the special query / result tags,
  and the Reason-in-Documents instruction (`get_webpage_to_reasonchain_instruction`) with its
  "**Final Information**" output format; the limit and repeated-query messages of scripts/run_search_o1.py.
"""

DIRECT_SYSTEM = ("Answer the question based on your own knowledge. Only give me the answer and do not output any "
                 "other words.")
QUESTION_USER = "Question: {question}"

RAG_SYSTEM = ("Answer the question based on the given document. Only give me the answer and do not output any "
              "other words.\nThe following are given documents.\n\n{reference}")
RAG_DOC = "Doc {number}(Title: {title}) {text}\n"

COT_USER = ("Please answer the following question. You should think step by step to solve it.\n\n"
            "Provide your final answer in the format \\boxed{{YOUR_ANSWER}}.\n\nQuestion:\n{question}\n\n")

IRCOT_INSTRUCTION = (
    "You serve as an intelligent assistant, adept at facilitating users through complex, multi-hop reasoning "
    "across multiple documents. This task is illustrated through demonstrations, each consisting of a document "
    "set paired with a relevant question and its multi-hop reasoning thoughts. Your task is to generate one "
    "thought for current step, DON'T generate the whole thoughts at once! If you reach what you believe to be "
    "the final step, start with \"So the answer is:\".")
IRCOT_EXAMPLE = (
    "Wikipedia Title: Kurram Garhi\nKurram Garhi is a small village located near the city of Bannu, which is the "
    "part of Khyber Pakhtunkhwa province of Pakistan. Its population is approximately 35000. Barren hills are near "
    "this village. This village is on the border of Kurram Agency. Other nearby villages are Peppal, Surwangi and "
    "Amandi Kala.\n\n"
    "Wikipedia Title: 2001–02 UEFA Champions League second group stage\nEight winners and eight runners- up from "
    "the first group stage were drawn into four groups of four teams, each containing two group winners and two "
    "runners- up. Teams from the same country or from the same first round group could not be drawn together. "
    "The top two teams in each group advanced to the quarter- finals.\n\n"
    "Wikipedia Title: Satellite tournament\nA satellite tournament is either a minor tournament or event on a "
    "competitive sporting tour or one of a group of such tournaments that form a series played in the same "
    "country or region.\n\n"
    "Wikipedia Title: Trojkrsti\nTrojkrsti is a village in Municipality of Prilep, Republic of Macedonia.\n\n"
    "Wikipedia Title: Telephone numbers in Ascension Island\nCountry Code:+ 247< br> International Call Prefix: "
    "00 Ascension Island does not share the same country code( +290) with the rest of St Helena.\n\n"
    "Question: Are both Kurram Garhi and Trojkrsti located in the same country?\n"
    "Thought: Kurram Garhi is located in the country of Pakistan. Trojkrsti is located in the country of "
    "Republic of Macedonia. Thus, they are not in the same country. So the answer is: no.\n\n")
IRCOT_DOC = "Wikipedia Title: {title}\n{text}\n\n"
IRCOT_USER = "{reference}Question: {question}\nThought:"
IRCOT_ANSWER_MARKER = "So the answer is:"

BEGIN_SEARCH_QUERY, END_SEARCH_QUERY = "<|begin_search_query|>", "<|end_search_query|>"
BEGIN_SEARCH_RESULT, END_SEARCH_RESULT = "<|begin_search_result|>", "<|end_search_result|>"

_SEARCH_O1_HEAD = (
    "You are a reasoning assistant with the ability to perform web searches to help you answer the user's "
    "question accurately. You have special tools:\n\n"
    f"- To perform a search: write {BEGIN_SEARCH_QUERY} your query here {END_SEARCH_QUERY}.\n"
    "Then, the system will search and analyze relevant web pages, then provide you with helpful information in "
    f"the format {BEGIN_SEARCH_RESULT} ...search results... {END_SEARCH_RESULT}.\n\n"
    "You can repeat the search process multiple times if necessary. The maximum number of search attempts is "
    "limited to {limit}.\n\n"
    "Once you have all the information you need, continue your reasoning.\n\n"
    "Example:\n")
_SEARCH_O1_TAIL = (
    "Remember:\n"
    f"- Use {BEGIN_SEARCH_QUERY} to request a web search and end with {END_SEARCH_QUERY}.\n"
    "- When done searching, continue your reasoning.\n\n")
SEARCH_O1_SINGLE_HOP = _SEARCH_O1_HEAD + (
    "Question: \"Who got the first Nobel Prize in Physics?\"\n"
    "Assistant thinking steps:\n"
    "- I need to find out who was awarded the first Nobel Prize in Physics.\n\n"
    "Assistant:\n"
    f"{BEGIN_SEARCH_QUERY}first Nobel Prize in Physics winner{END_SEARCH_QUERY}\n\n"
    "(System returns processed information from relevant web pages)\n\n"
    "Assistant continues reasoning with the new information...\n\n") + _SEARCH_O1_TAIL
SEARCH_O1_MULTI_HOP = _SEARCH_O1_HEAD + (
    "Question: \"Alice David is the voice of Lara Croft in a video game developed by which company?\"\n"
    "Assistant thinking steps:\n"
    "- I need to find out who voices Lara Croft in the video game.\n"
    "- Then, I need to determine which company developed that video game.\n\n"
    "Assistant:\n"
    f"{BEGIN_SEARCH_QUERY}Alice David Lara Croft voice{END_SEARCH_QUERY}\n\n"
    "(System returns processed information from relevant web pages)\n\n"
    "Assistant thinks: The search results indicate that Alice David is the voice of Lara Croft in a specific "
    "video game. Now, I need to find out which company developed that game.\n\n"
    "Assistant:\n"
    f"{BEGIN_SEARCH_QUERY}video game developed by Alice David Lara Croft{END_SEARCH_QUERY}\n\n"
    "(System returns processed information from relevant web pages)\n\n"
    "Assistant continues reasoning with the new information...\n\n") + _SEARCH_O1_TAIL
SEARCH_O1_SINGLE_HOP_SOURCES = ("nq", "triviaqa", "popqa")  # Search-o1's single-QA instruction; the rest: multi

REASON_IN_DOCUMENTS = """**Task Instruction:**

You are tasked with reading and analyzing web pages based on the following inputs: **Previous Reasoning Steps**, **Current Search Query**, and **Searched Web Pages**. Your objective is to extract relevant and helpful information for **Current Search Query** from the **Searched Web Pages** and seamlessly integrate this information into the **Previous Reasoning Steps** to continue reasoning for the original question.

**Guidelines:**

1. **Analyze the Searched Web Pages:**
- Carefully review the content of each searched web page.
- Identify factual information that is relevant to the **Current Search Query** and can aid in the reasoning process for the original question.

2. **Extract Relevant Information:**
- Select the information from the Searched Web Pages that directly contributes to advancing the **Previous Reasoning Steps**.
- Ensure that the extracted information is accurate and relevant.

3. **Output Format:**
- **If the web pages provide helpful information for current search query:** Present the information beginning with `**Final Information**` as shown below.
**Final Information**

[Helpful information]

- **If the web pages do not provide any helpful information for current search query:** Output the following text.

**Final Information**

No helpful information found.

**Inputs:**
- **Previous Reasoning Steps:**  
{prev_reasoning}

- **Current Search Query:**  
{search_query}

- **Searched Web Pages:**  
{document}

Now you should analyze each web page and find helpful information based on the current search query "{search_query}" and previous reasoning steps.
"""
FINAL_INFORMATION = "\n**Final Information**"
NO_INFORMATION = "No helpful information found."
WEB_PAGE = "**Web Page {number}:**\n{page}\n"  # page: JSON of {"title", "text"} (Search-o1 dumps its doc_info)
SEARCH_LIMIT_MESSAGE = (f"\n{BEGIN_SEARCH_RESULT}\nThe maximum search limit is exceeded. You are not allowed to "
                        f"search.\n{END_SEARCH_RESULT}\n")
REPEATED_QUERY_MESSAGE = (f"\n{BEGIN_SEARCH_RESULT}\nYou have searched this query. Please refer to previous "
                          f"results.\n{END_SEARCH_RESULT}\n")
SEARCH_RESULT = f"\n\n{BEGIN_SEARCH_RESULT}{{info}}{END_SEARCH_RESULT}\n\n"
